"""The config reader on hostile JSON: nesting past the limit is refused quickly (it once overflowed the
stack), and error messages quote a short prefix of a huge value."""

import json
import time

import pytest

import loom


def test_resolve_config_refuses_deep_json_quickly(tmp_path):
    # ~70,000 levels used to overflow the stack (a segfault) while the error message was written.
    deep = '{"model": ' + "[" * 70000 + "]" * 70000 + "}"
    (tmp_path / "deep.json").write_text(deep)
    for call in (lambda: loom.resolve_config(tmp_path / "deep.json"),
                 lambda: loom._loom.resolve_config(deep, True, [])):
        start = time.monotonic()
        with pytest.raises(ValueError, match="more than 64 levels deep"):
            call()
        assert time.monotonic() - start < 1.0


def test_config_errors_quote_a_short_prefix(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"model": {"d_model": "x" * 1_000_000}}))
    with pytest.raises(ValueError, match="model.d_model must be an integer") as e:
        loom.resolve_config(tmp_path / "c.json")
    assert len(str(e.value)) < 300
