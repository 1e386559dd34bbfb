"""Functional ops on numpy arrays, with the semantics of loom's C++ ops (src/ops/*.h).

Every function takes array-likes (float inputs are converted to float32, ids to int32) and returns a new
float32 numpy array. Leading batch dimensions ("...") are accepted wherever the op allows them.
"""

from __future__ import annotations

import numpy as np

from . import _loom
from typing import Annotated

from ._arrays import INT32, NONNEGATIVE, POSITIVE, SIZE, BoolArray, FloatArray, IntArray, boolean, checked, f32, i32, shown


@checked
def linear(x: FloatArray, weight: FloatArray) -> np.ndarray:
    """x @ weight.T. x: [..., d_in]; weight: [d_out, d_in] (PyTorch's layout). Returns [..., d_out]."""
    return _loom.linear(f32(x), f32(weight, "weight"))


@checked
def embedding(ids: IntArray, weight: FloatArray) -> np.ndarray:
    """Rows of weight [V, C] for integer ids [...]. Returns [..., C]. An id outside [0, V) is a ValueError."""
    return _loom.embedding(i32(ids), f32(weight, "weight"))


@checked
def silu(x: FloatArray) -> np.ndarray:
    """x * sigmoid(x), element-wise."""
    return _loom.silu(f32(x))


@checked
def softmax(x: FloatArray, dim: Annotated[int, INT32] = -1) -> np.ndarray:
    """Numerically stable softmax over dimension `dim` (negative counts from the end)."""
    return _loom.softmax(f32(x), int(dim))


@checked
def rms_norm(x: FloatArray, weight: FloatArray, eps: Annotated[float, NONNEGATIVE] = 1e-5) -> np.ndarray:
    """x / sqrt(mean(x^2, last dim) + eps) * weight. x: [..., C]; weight: [C]."""
    return _loom.rms_norm(f32(x), f32(weight, "weight"), float(eps))


@checked
def swiglu(x: FloatArray, w1: FloatArray, w2: FloatArray, w3: FloatArray) -> np.ndarray:
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
def scaled_dot_product_attention(q: FloatArray, k: FloatArray, v: FloatArray, mask: BoolArray | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt(D) + mask) v.

    q: [..., Tq, D]; k: [..., Tk, D]; v: [..., Tk, Dv], with equal leading dimensions. mask: boolean,
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
def rope(x: FloatArray, positions: IntArray, theta: Annotated[float, POSITIVE] = 10000.0,
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
def multihead_self_attention(x: FloatArray, q_proj: FloatArray, k_proj: FloatArray, v_proj: FloatArray,
                             o_proj: FloatArray, num_heads: Annotated[int, SIZE],
                             theta: Annotated[float, POSITIVE] | None = None, positions: IntArray | None = None) -> np.ndarray:
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
    elif positions is not None:
        raise ValueError(f"multihead_self_attention: positions={shown(positions)} given without theta: positions are "
                         "only used with RoPE; give theta too")
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
def cross_entropy(logits: FloatArray, targets: IntArray, ignore_index: Annotated[int, INT32] = -100) -> float:
    """Mean cross-entropy of logits [..., V] against integer targets [...]; targets equal to
    ignore_index count in neither the sum nor the mean."""
    return float(_loom.cross_entropy(f32(logits, "logits"), i32(targets, "targets"), int(ignore_index)))
