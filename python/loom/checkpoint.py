"""Checkpoints: model weights, optimizer state and the iteration in one safetensors file.

Layout (loom's safetensors, readable by any safetensors reader):
  model.<dotted name>            float32 weights
  optimizer.exp_avg.<i>          AdamW first moment of parameter i (in the optimizer's order)
  optimizer.exp_avg_sq.<i>       second moment
  metadata: loom.iteration, loom.optimizer (JSON: step, lr, betas, eps, weight_decay, num_params),
            loom.model_config (JSON, when the model has a config)
"""

from __future__ import annotations

import json
import os

import numpy as np

from . import _loom


def save_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes name -> array (float32, int32, uint16 or bool; other floats become float32, other ints
    int32) atomically, with string metadata."""
    out = {}
    for name, a in tensors.items():
        a = np.asarray(a)
        if a.dtype not in (np.float32, np.int32, np.uint16, np.bool_):
            a = a.astype(np.float32 if a.dtype.kind == "f" else np.int32)
        out[name] = np.ascontiguousarray(a)
    _loom.save_safetensors(os.fspath(path), out, {str(k): str(v) for k, v in (metadata or {}).items()})


def load_safetensors(path) -> tuple[dict, dict]:
    """(name -> array, metadata) of a safetensors file."""
    tensors, meta = _loom.load_safetensors(os.fspath(path))
    return dict(tensors), dict(meta)


def _model_state(model):
    return model if isinstance(model, dict) else model.state_dict()


def save_checkpoint(model, optimizer, iteration: int, out) -> None:
    """Saves model (a TransformerLM/TransformerBlock, or a dict of arrays), optimizer (an AdamW or None)
    and the iteration to the path `out`."""
    tensors = {f"model.{k}": v for k, v in _model_state(model).items()}
    meta = {"loom.iteration": str(int(iteration))}
    if hasattr(model, "config"):
        meta["loom.model_config"] = json.dumps(model.config)
    if optimizer is not None:
        s = optimizer.state_dict()
        for i, (m, v) in enumerate(zip(s["exp_avg"], s["exp_avg_sq"])):
            if m is not None:
                tensors[f"optimizer.exp_avg.{i}"] = m
                tensors[f"optimizer.exp_avg_sq.{i}"] = v
        meta["loom.optimizer"] = json.dumps({"step": s["step"], "lr": s["lr"], "betas": list(s["betas"]),
                                             "eps": s["eps"], "weight_decay": s["weight_decay"],
                                             "num_params": len(s["exp_avg"])})
    save_safetensors(out, tensors, meta)


def load_checkpoint(src, model, optimizer=None) -> int:
    """Restores what save_checkpoint wrote into `model` (load_state_dict, or a dict updated in place)
    and `optimizer`; returns the iteration."""
    tensors, meta = load_safetensors(src)
    if "loom.iteration" not in meta:
        raise ValueError(f"{os.fspath(src)} is not a loom checkpoint (no loom.iteration in its metadata)")
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    if isinstance(model, dict):
        for k, v in weights.items():
            if k not in model:
                raise ValueError(f"load_checkpoint: the checkpoint has '{k}', which the model dict lacks")
            np.copyto(model[k], v)
    else:
        model.load_state_dict(weights)
    if optimizer is not None:
        if "loom.optimizer" not in meta:
            raise ValueError(f"{os.fspath(src)} holds no optimizer state")
        o = json.loads(meta["loom.optimizer"])
        n = o["num_params"]
        optimizer.load_state_dict({
            "step": o["step"],
            "exp_avg": [tensors.get(f"optimizer.exp_avg.{i}") for i in range(n)],
            "exp_avg_sq": [tensors.get(f"optimizer.exp_avg_sq.{i}") for i in range(n)],
        })
    return int(meta["loom.iteration"])
