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
from typing import Annotated, Mapping

import numpy as np
from numpy.typing import ArrayLike

from . import _loom
from ._arrays import COUNT, Path, Reads, Relation, Writes, checked, shown
from .model import Model, TransformerBlock
from .optim import AdamW


# The numpy dtypes safetensors stores, by numpy's name: each is written as itself (never narrowed: an
# int64 past 2^31 once came back wrapped, written as int32) and read back as itself.
_STORABLE = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
             "float32", "float64", "complex64")


@checked
def save_safetensors(path: Annotated[Path, Writes("file")], tensors: Mapping[str, ArrayLike],
                     metadata: Mapping | None = None) -> None:
    """Writes name -> array atomically, with string metadata. Every array keeps its dtype: bool, int8 to
    int64, uint8 to uint64, float16, float32, float64 or complex64 (stored little-endian, as the format
    says). Other dtypes (complex128, longdouble, strings, objects, dates) are a ValueError: safetensors
    has no such type, and converting silently would change the values."""
    out = {}
    for name, a in tensors.items():
        a = np.asarray(a)
        if a.dtype.name not in _STORABLE or a.dtype.kind not in "biufc":
            raise ValueError(f"save_safetensors: '{name}' has dtype {a.dtype}, which safetensors cannot store "
                             f"(it stores {', '.join(_STORABLE)}); convert it first")
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not np.little_endian):
            a = a.astype(a.dtype.newbyteorder("<"))
        out[name] = a if a.flags.c_contiguous else a.copy(order="C")  # ascontiguousarray makes 0-d arrays 1-d
    _loom.save_safetensors(os.fspath(path), out, {str(k): str(v) for k, v in (metadata or {}).items()})


@checked
def load_safetensors(path: Annotated[Path, Reads("safetensors")]) -> tuple[dict, dict]:
    """(name -> array, metadata) of a safetensors file, each array of its stored dtype (BF16 comes back
    as float32, as numpy has no bfloat16; the 4-, 6- and 8-bit float types are a ValueError)."""
    tensors, meta = _loom.load_safetensors(os.fspath(path))
    return dict(tensors), dict(meta)


def _model_state(model):
    return model if isinstance(model, dict) else model.state_dict()


class MomentsOf(Relation):
    """An optimizer whose moments belong to the parameters of the model `target`, one for one in order
    (moments of parameters not yet updated excepted)."""
    words = "must hold the moments of"

    @staticmethod
    def mismatch(optimizer, model) -> str:
        shapes = [np.shape(v) for v in (model if isinstance(model, dict) else model.parameters()).values()]
        moments = optimizer.state_dict()["exp_avg"]
        if moments and len(moments) != len(shapes):
            return f"it holds moments for {len(moments)} parameters, the model has {len(shapes)}"
        for i, (m, s) in enumerate(zip(moments, shapes)):
            if m is not None and m.shape != s:
                return f"its moment {i} has shape {m.shape}, the model's parameter {i} has shape {s}"
        return ""

    def holds(self, value, target):
        return not self.mismatch(value, target)


class FitsCheckpoint(Relation):
    """A model whose parameters have the names and shapes of the weights in the checkpoint file `target`."""
    words = "must match the weights in"

    def holds(self, value, target):
        tensors, _ = _loom.load_safetensors(os.fspath(target))
        mine = {k: np.shape(v) for k, v in _model_state(value).items()}
        theirs = {k[len("model."):]: tuple(v.shape) for k, v in dict(tensors).items() if k.startswith("model.")}
        return mine == theirs


@checked
def save_checkpoint(model: Model | TransformerBlock | Mapping[str, ArrayLike],
                    optimizer: Annotated[AdamW, MomentsOf("model")] | None, iteration: Annotated[int, COUNT],
                    out: Annotated[Path, Writes("file")]) -> None:
    """Saves model (a TransformerLM/TransformerBlock, or a dict of arrays), optimizer (an AdamW or None)
    and the iteration to the path `out`."""
    # An optimizer stepped on another model's parameters would be written beside this model's weights,
    # and a resume would fail (or, with equal counts, apply another model's moments).
    wrong = "" if optimizer is None else MomentsOf.mismatch(optimizer, model)
    if wrong:
        raise ValueError(f"save_checkpoint: optimizer does not belong to model: {wrong}")
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


@checked
def load_checkpoint(src: Annotated[Path, Reads("checkpoint")],
                    model: Annotated[Model | TransformerBlock | Mapping[str, ArrayLike], FitsCheckpoint("src")],
                    optimizer: AdamW | None = None) -> int:
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
        # Another model's checkpoint: said with both parameters, not as load_state_dict's missing names.
        mine = {k: v.shape for k, v in model.parameters().items()}  # live views: no copy of the weights
        theirs = {k: v.shape for k, v in weights.items()}
        if mine != theirs:
            missing = [k for k in mine if k not in theirs]
            unexpected = [k for k in theirs if k not in mine]
            shapes = [f"{k} {mine[k]} here, {theirs[k]} there" for k in mine if k in theirs and mine[k] != theirs[k]]
            raise ValueError(f"load_checkpoint: model does not match the weights in src={shown(os.fspath(src))}: "
                             f"missing {shown(missing)}, unexpected {shown(unexpected)}, shapes {shown(shapes)}")
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
