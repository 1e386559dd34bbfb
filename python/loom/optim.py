"""AdamW, global-norm gradient clipping and the cosine schedule, on numpy arrays.

AdamW.step updates the parameter arrays in place (they must be writeable, C-contiguous float32: the
arrays from TransformerLM.parameters() are, and updating them trains the model) and returns None. The
update is the C++ trainer's own kernel (PyTorch's AdamW semantics: bias correction, decoupled weight
decay).
"""

from __future__ import annotations

from typing import Annotated, Mapping, Sequence

import numpy as np

from . import _loom
from ._arrays import COUNT, NONNEGATIVE, POSITIVE, AtMost, SameShapes, checked, f32, inplace_f32


class AdamW:
    @checked
    def __init__(self, lr: Annotated[float, NONNEGATIVE] = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: Annotated[float, POSITIVE] = 1e-8, weight_decay: Annotated[float, NONNEGATIVE] = 0.01):
        self._o = _loom.AdamW(float(lr), float(betas[0]), float(betas[1]), float(eps), float(weight_decay))
        self.lr = float(lr)

    @checked
    def step(self, params: Sequence | Mapping, grads: Annotated[Sequence, SameShapes("params")] | Mapping,
             lr: Annotated[float, NONNEGATIVE] | None = None) -> None:
        """One update of every parameter whose gradient is not None. params and grads are lists in the
        same order, or dicts by name (a gradient missing from the dict counts as None). The optimizer
        keeps its moments by position, so pass the parameters in the same order every step."""
        if isinstance(params, Mapping):
            names = list(params)
            ps = [params[n] for n in names]
            gs = [grads.get(n) for n in names] if isinstance(grads, Mapping) else list(grads)
        else:
            ps, gs = list(params), list(grads)
        ps = [inplace_f32(p, f"params[{i}]") for i, p in enumerate(ps)]
        # A gradient is only read, so any float array will do; the conversion copies when needed.
        gs = [None if g is None else f32(g, f"grads[{i}]") for i, g in enumerate(gs)]
        self._o.step(ps, gs, float(self.lr if lr is None else lr))

    @property
    def step_count(self) -> int:
        return int(self._o.state()["step"])

    def state_dict(self) -> dict:
        """{"step", "exp_avg", "exp_avg_sq" (lists of arrays, None before a parameter's first update),
        "lr", "betas", "eps", "weight_decay"}: copies."""
        s = dict(self._o.state())
        s["exp_avg"], s["exp_avg_sq"] = list(s["exp_avg"]), list(s["exp_avg_sq"])
        s.update(lr=self.lr, betas=tuple(self._o.betas), eps=self._o.eps, weight_decay=self._o.weight_decay)
        return s

    @checked
    def load_state_dict(self, state: Annotated[Mapping, SameShapes("state.exp_avg", of="exp_avg_sq")]) -> None:
        """Restores the step count and moments (the hyperparameters stay the constructor's)."""
        m = [None if a is None else f32(a, "exp_avg") for a in state["exp_avg"]]
        v = [None if a is None else f32(a, "exp_avg_sq") for a in state["exp_avg_sq"]]
        self._o.load_state(int(state["step"]), m, v)


@checked
def clip_grad_norm(grads: Sequence, max_norm: Annotated[float, POSITIVE]) -> float:
    """Scales the gradients in place by max_norm / (norm + 1e-6) when their global L2 norm exceeds
    max_norm (CS336's gradient_clipping). None entries are skipped; the others must be writeable,
    C-contiguous float32 arrays. Returns the norm before clipping."""
    gs = [inplace_f32(g, f"grads[{i}]") for i, g in enumerate(grads) if g is not None]
    return float(_loom.clip_grad_norm(gs, float(max_norm)))


@checked
def cosine_lr(it: Annotated[int, COUNT], max_lr: Annotated[float, NONNEGATIVE],
              min_lr: Annotated[float, NONNEGATIVE, AtMost("max_lr")],
              warmup_iters: Annotated[int, COUNT, AtMost("cosine_cycle_iters")],
              cosine_cycle_iters: Annotated[int, COUNT]) -> float:
    """CS336's schedule: linear warmup from 0 to max_lr over warmup_iters, cosine decay to min_lr at
    cosine_cycle_iters, min_lr afterwards."""
    return float(_loom.cosine_lr(int(it), float(max_lr), float(min_lr), int(warmup_iters), int(cosine_cycle_iters)))
