"""Every family through loom.Model: GPT-2 against the independent PyTorch GPT-2 in
tests/models/gpt2/fixtures/gpt2_lm.json (float64 oracle), a generic config, save/load, and concurrent use."""

import json
import os
import threading

import numpy as np
import pytest

import loom
from conftest import REPO


@pytest.fixture(scope="module")
def gpt2_fixture():
    with open(os.path.join(REPO, "tests", "models", "gpt2", "fixtures", "gpt2_lm.json")) as f:
        raw = json.load(f)
    out = {}
    for k, v in raw.items():
        if k.endswith("config_json"):
            out[k] = v
        else:
            out[k] = np.asarray(v["data"], dtype=np.int32 if v["dtype"] == "i32" else np.float32).reshape(v["shape"])
    return out


@pytest.mark.parametrize("variant", ["tied", "untied"])
def test_gpt2_matches_pytorch(gpt2_fixture, variant):
    fx = {k[len(variant) + 1:]: v for k, v in gpt2_fixture.items() if k.startswith(variant + ".")}
    weights = {k[5:]: v for k, v in fx.items() if k.startswith("init.")}
    model = loom.Model.from_config(dict(fx["config_json"], arch="gpt2"), weights=weights)
    assert model.arch == "gpt2"
    assert model.config["tie_embeddings"] == (variant == "tied")
    assert set(model.parameter_names()) == set(weights)
    assert model.num_params == sum(v.size for v in weights.values())
    np.testing.assert_allclose(model.forward(fx["ids"]), fx["logits"], rtol=1e-4, atol=2e-5)
    loss, grads = model.loss_and_grads(fx["ids"], fx["targets"])
    assert abs(loss - float(fx["loss"][0])) < 1e-5
    for name, g in grads.items():
        np.testing.assert_allclose(g, fx["grad." + name], rtol=1e-3, atol=2e-5, err_msg=name)


def test_from_config_defaults_and_errors(tmp_path):
    m = loom.Model.from_config({"arch": "gpt2", "vocab_size": 50, "context_length": 8, "d_model": 16,
                                "num_layers": 1, "num_heads": 2})
    assert m.config["d_ff"] == 0 and m.config["qkv_bias"] is True  # the family's defaults
    ids = np.array([[1, 2, 3]], dtype=np.int32)
    path = tmp_path / "m.safetensors"
    m.save(path)
    back = loom.Model.load(path)
    assert back.arch == "gpt2"
    np.testing.assert_array_equal(back.forward(ids), m.forward(ids))
    assert isinstance(loom.Model.from_config({"vocab_size": 30, "context_length": 8, "d_model": 16, "num_layers": 1,
                                              "num_heads": 2, "d_ff": 32}), loom.TransformerLM)
    with pytest.raises(ValueError, match="model.d_model=16 is not divisible by model.num_heads=3"):
        loom.Model.from_config({"arch": "gpt2", "d_model": 16, "num_heads": 3})
    with pytest.raises(ValueError, match="unknown key model.rope_theta"):
        loom.Model.from_config({"arch": "gpt2", "rope_theta": 1.0})
    with pytest.raises(ValueError, match="not a model family"):
        loom.Model.from_config({"arch": "mamba"})
    with pytest.raises(ValueError, match="holds a gpt2 model"):
        loom.TransformerLM.load(path)


def test_loss_and_grads_from_several_threads(gpt2_fixture):
    """The GIL is released during compute: concurrent gradient calls on one model take turns on its
    lock, so every thread gets the single-threaded answer."""
    fx = {k[5:]: v for k, v in gpt2_fixture.items() if k.startswith("tied.")}
    weights = {k[5:]: v for k, v in fx.items() if k.startswith("init.")}
    model = loom.Model.from_config(dict(fx["config_json"], arch="gpt2"), weights=weights)
    want_loss, want = model.loss_and_grads(fx["ids"], fx["targets"])
    errors = []

    def worker():
        try:
            for _ in range(5):
                loss, grads = model.loss_and_grads(fx["ids"], fx["targets"])
                assert loss == want_loss
                for k, g in grads.items():
                    np.testing.assert_array_equal(g, want[k])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_deepseek_v3_through_the_generic_model(tmp_path):
    """The DeepSeek-V3 family needs nothing of its own in Python: build, forward, loss, gradients, generate,
    save and load (the routing biases, model state, travel with the weights file)."""
    section = loom.resolve_config("dsv3-tiny")["model"]  # the file states only what differs from the defaults
    model = loom.Model.from_config(section, seed=3)
    assert model.arch == "deepseek_v3"
    assert model.config["kv_rank"] == 8 and model.config["top_k"] == 2
    assert model.num_params == sum(v.size for v in model.state_dict().values())
    assert not any(name.endswith("moe.bias") for name in model.parameter_names())
    ids = np.arange(20, dtype=np.int32).reshape(2, 10) % section["vocab_size"]
    logits = model.forward(ids)
    assert logits.shape == (2, 10, section["vocab_size"])
    loss, grads = model.loss_and_grads(ids, np.roll(ids, -1, axis=1))
    assert np.isfinite(loss) and 5.5 < loss < 7.0  # near ln(512) at init
    assert grads["layers.1.moe.experts.w1"].shape == (4, 16, 32)
    out = model.generate([1, 2, 3], max_new_tokens=5, temperature=0)
    assert len(out) == 5
    path = tmp_path / "model.safetensors"
    model.save(path)
    again = loom.Model.load(path)
    np.testing.assert_array_equal(again.forward(ids), logits)
