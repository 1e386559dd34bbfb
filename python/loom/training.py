"""Training runs from Python: the same loop, config and run directory as `loom train`."""

from __future__ import annotations

import copy
import json
import os
from typing import Annotated, Mapping, Sequence

from . import _loom
from ._arrays import AtMost, Divides, Keys, Path, Reads, Writes, checked

# Keys of a training config that must agree with each other (train/config.cpp and the model families
# check them, naming the keys): overrides that are right alone may break them together with the config.
CONFIG_KEYS = Keys(("optimizer.min_lr", AtMost("optimizer.lr")), ("model.num_heads", Divides("model.d_model")),
                   ("model.num_heads", Divides("model.d_model", times=2)),
                   ("model.num_kv_heads", Divides("model.num_heads", unless=0)), base="config")
Overrides = Annotated[Mapping, CONFIG_KEYS] | Sequence[str] | None


@checked
def resolve_config(config: Annotated[Path, Reads("config")] | Mapping = "default",
                   overrides: Overrides = None) -> dict:
    """The complete, checked training config: a preset name ("tiny", "default", "cs336-tinystories"), a
    JSON file, or a dict (missing keys take the defaults), then overrides as {"optimizer.lr": 3e-4} or
    ["optimizer.lr=3e-4"]. A wrong key, type or value is a ValueError naming the key."""
    if isinstance(overrides, Mapping):
        items = [(k, v) for k, v in overrides.items()]
    else:
        items = [tuple(s.split("=", 1)) for s in (overrides or [])]
        items = [(k, _parse_value(v)) for k, v in items]
    if isinstance(config, Mapping):
        cfg = copy.deepcopy(dict(config))
        for key, value in items:
            section, _, name = key.partition(".")
            if not name:
                raise ValueError(f"config override '{key}' must be section.key")
            cfg.setdefault(section, {})[name] = value
        return json.loads(_loom.resolve_config(json.dumps(cfg), True, []))
    return json.loads(_loom.resolve_config(os.fspath(config), False, [f"{k}={json.dumps(v)}" for k, v in items]))


def _parse_value(v: str):
    try:
        return json.loads(v)
    except ValueError:
        return v


@checked
def train(config: Annotated[Path, Reads("config")] | Mapping = "default", out_dir: Annotated[Path, Writes("run")] | None = None,
          overrides: Overrides = None, overwrite: bool = False) -> dict:
    """Trains as `loom train --config CONFIG --out OUT_DIR --set ...` does: prepares the tokenizer and
    token files the config names when missing, trains, and writes OUT_DIR/model.safetensors,
    config.json and tokenizer.json. Runs entirely in C++ with the GIL released; Ctrl-C stops cleanly
    after the current step. Returns the summary (steps_completed, steps_skipped, last_loss,
    first_val_loss, last_val_loss, tokens_per_s, stopped_early) and run_dir. OUT_DIR must be new or
    empty, or (with overwrite=True) one of loom's runs, as for `loom train` (docs/guarantees.md)."""
    cfg = resolve_config(config, overrides)
    if out_dir is None:
        name = "custom" if isinstance(config, Mapping) else os.path.splitext(os.path.basename(os.fspath(config)))[0]
        out_dir = os.path.join("runs", name)
    summary = dict(_loom.train(json.dumps(cfg), os.fspath(out_dir), bool(overwrite)))
    summary["run_dir"] = os.fspath(out_dir)
    return summary
