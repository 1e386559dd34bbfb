"""Functional ops on numpy arrays, with the semantics of loom's C++ ops (src/ops/*.h).

Every function takes array-likes (float inputs are converted to float32, ids to int32) and returns a new
float32 numpy array. Leading batch dimensions ("...") are accepted wherever the op allows them.
"""

from __future__ import annotations

import numpy as np

from . import _loom
from typing import Annotated

from numpy.typing import ArrayLike

from ._arrays import (INT32, NONNEGATIVE, POSITIVE, SIZE, ArrayOf, Axis, Divides, FloatArray, Requires, boolean, checked,
                      f32, i32)


def _f(shape, **relations):
    """A float array of this shape (ArrayOf's symbols: arrays of one call that share a symbol agree on it)."""
    return Annotated[ArrayLike, ArrayOf("float", shape, **relations)]


def _ids(shape, **relations):
    return Annotated[ArrayLike, ArrayOf("int", shape, **relations)]


@checked
def linear(x: _f("..., K"), weight: _f("N, K")) -> np.ndarray:
    """x @ weight.T. x: [..., d_in]; weight: [d_out, d_in] (PyTorch's layout). Returns [..., d_out]."""
    return _loom.linear(f32(x), f32(weight, "weight"))


@checked
def embedding(ids: _ids("...", below="V"), weight: _f("V, C")) -> np.ndarray:
    """Rows of weight [V, C] for integer ids [...]. Returns [..., C]. An id outside [0, V) is a ValueError."""
    return _loom.embedding(i32(ids), f32(weight, "weight"))


@checked
def silu(x: FloatArray) -> np.ndarray:
    """x * sigmoid(x), element-wise."""
    return _loom.silu(f32(x))


@checked
def softmax(x: FloatArray, dim: Annotated[int, INT32, Axis("x.ndim")] = -1) -> np.ndarray:
    """Numerically stable softmax over dimension `dim` (negative counts from the end)."""
    return _loom.softmax(f32(x), int(dim))


@checked
def rms_norm(x: _f("..., C"), weight: _f("C"), eps: Annotated[float, NONNEGATIVE] = 1e-5) -> np.ndarray:
    """x / sqrt(mean(x^2, last dim) + eps) * weight. x: [..., C]; weight: [C]."""
    return _loom.rms_norm(f32(x), f32(weight, "weight"), float(eps))


@checked
def swiglu(x: _f("..., C"), w1: _f("F, C"), w2: _f("C, F"), w3: _f("F, C")) -> np.ndarray:
    """The SwiGLU feed-forward: w2(silu(x w1^T) * (x w3^T)). x: [..., C]; w1, w3: [F, C]; w2: [C, F]."""
    x, w1, w2, w3 = f32(x), f32(w1, "w1"), f32(w2, "w2"), f32(w3, "w3")
    c = x.shape[-1] if x.ndim else None
    f = w1.shape[0] if w1.ndim == 2 else None
    want = {"w1": (f, c), "w3": (f, c), "w2": (c, f)}
    for name, w in (("w1", w1), ("w3", w3), ("w2", w2)):
        if x.ndim == 0 or w.shape != want[name]:
            raise ValueError(f"swiglu: {name} has shape {w.shape}; with x {x.shape} and w1 {w1.shape} it must be "
                             f"{want[name]} (w1, w3: [F, C]; w2: [C, F])")
    return _loom.swiglu(x, w1, w2, w3)


@checked
def scaled_dot_product_attention(q: _f("..., Tq, D"), k: _f("..., Tk, D"), v: _f("..., Tk, Dv"),
                                 mask: Annotated[ArrayLike, ArrayOf("bool", "Tq, Tk")] | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt(D) + mask) v.

    q: [..., Tq, D]; k: [..., Tk, D]; v: [..., Tk, Dv], with equal leading dimensions, except that k and v
    may have fewer heads than q in the last one (a divisor of q's: grouped-query attention). mask: boolean,
    True where a query may attend a key, broadcastable to [..., Tq, Tk] (a [Tq, Tk] mask is shared by
    all leading dimensions). A query that may attend no key gets zeros. Returns [..., Tq, Dv].
    """
    q, k, v = f32(q, "q"), f32(k, "k"), f32(v, "v")
    m = None
    if mask is not None:
        m = np.asarray(mask)
        if m.ndim != 2:
            target = q.shape[:-1] + (k.shape[-2],)
            try:
                m = np.broadcast_to(m, target)
            except ValueError:
                raise ValueError(f"scaled_dot_product_attention: mask of shape {m.shape} does not broadcast to "
                                 f"{target} ([..., Tq, Tk])") from None
        m = boolean(m)
    return _loom.scaled_dot_product_attention(q, k, v, m, False)


@checked
def rope(x: _f("..., T, D", multiple_of={"D": "2"}), positions: _ids("T"), theta: Annotated[float, POSITIVE] = 10000.0,
         style: str = "interleaved") -> np.ndarray:
    """Rotary position embedding. x: [..., T, D] (D even); positions: integer [T], or broadcastable to
    x's leading shape [..., T]. Pair i at position p turns by p * theta^(-2i/D). style "interleaved"
    rotates (x[2i], x[2i+1]) (CS336, RoFormer); "rotate_half" rotates (x[i], x[i+D/2]) (Hugging Face)."""
    x = f32(x)
    p = np.asarray(positions)
    if p.ndim > 1 and p.shape != x.shape[:-1]:
        p = np.broadcast_to(p, x.shape[:-1])
    return _loom.rope(x, i32(p, "positions"), float(theta), style)


@checked
def multihead_self_attention(x: _f("..., T, C"), q_proj: _f("C, C"), k_proj: _f("C, C"), v_proj: _f("C, C"),
                             o_proj: _f("C, C"), num_heads: Annotated[int, SIZE, Divides("C"), Divides("C", times=2)],
                             theta: Annotated[float, POSITIVE] | None = None,
                             positions: Annotated[ArrayLike, ArrayOf("int", "T"), Requires("theta")] | None = None) -> np.ndarray:
    """Causal multi-head self-attention from the four projection matrices ([d_model, d_model] each,
    [out, in]). x: [..., T, d_model]. With `theta`, RoPE (interleaved) turns queries and keys at
    `positions` (integer [T] or [..., T]; default 0..T-1). Returns [..., T, d_model]."""
    x = f32(x)
    if x.ndim < 2:
        raise ValueError(f"multihead_self_attention: x must be [..., T, d_model], got shape {x.shape}")
    lead, (t, c) = x.shape[:-2], x.shape[-2:]
    rows = int(np.prod(lead, dtype=np.int64))  # not -1: an empty x cannot infer it
    xb = x.reshape((rows, t, c))
    pos = None
    if theta is not None:
        p = np.arange(t) if positions is None else np.asarray(positions)
        if p.ndim > 1:
            p = np.broadcast_to(p, lead + (t,)).reshape((rows, t))
        pos = i32(p, "positions")
    # positions without theta: refused by `checked` (Requires("theta")).
    projs = {n: f32(w, n) for n, w in (("q_proj", q_proj), ("k_proj", k_proj), ("v_proj", v_proj), ("o_proj", o_proj))}
    for n, w in projs.items():
        if w.shape != (c, c):
            raise ValueError(f"multihead_self_attention: {n} has shape {w.shape}; with x {x.shape} it must be "
                             f"[d_model, d_model] = {(c, c)}")
    y = _loom.multihead_self_attention(xb, projs["q_proj"], projs["k_proj"], projs["v_proj"], projs["o_proj"],
                                       int(num_heads),
                                       None if theta is None else float(theta), pos)
    return y.reshape(lead + (t, c))


@checked
def cross_entropy(logits: _f("..., V"), targets: _ids("...", below="V", ignore="ignore_index"), ignore_index: Annotated[int, INT32] = -100) -> float:
    """Mean cross-entropy of logits [..., V] against integer targets [...]; targets equal to
    ignore_index count in neither the sum nor the mean."""
    return float(_loom.cross_entropy(f32(logits, "logits"), i32(targets, "targets"), int(ignore_index)))
