"""Shared helpers for the loom Python tests: the repo's committed PyTorch fixtures and numpy oracles."""

import json
import os

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_fixture(relpath):
    """tests/<folder>/fixtures/<name>.json as {key: numpy array} (the C++ suites' PyTorch dumps)."""
    with open(os.path.join(REPO, "tests", relpath)) as f:
        raw = json.load(f)
    out = {}
    for k, v in raw.items():
        dtype = {"f32": np.float32, "i32": np.int32}.get(v.get("dtype"), np.float64)
        out[k] = np.asarray(v["data"], dtype=dtype).reshape(v["shape"])
    return out


@pytest.fixture(scope="session")
def lm_fixture():
    return load_fixture("models/llama/fixtures/transformer_lm.json")


def lm_config(fx):
    c = fx["config"]
    return dict(vocab_size=int(c[0]), context_length=int(c[1]), d_model=int(c[2]), num_layers=int(c[3]),
                num_heads=int(c[4]), d_ff=int(c[5]), rope_theta=float(c[6]))


def lm_weights(fx, prefix="init."):
    return {k[len(prefix):]: v for k, v in fx.items() if k.startswith(prefix)}


# ---- numpy oracles (float64) ----

def np_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_silu(x):
    x = np.asarray(x, np.float64)
    return x / (1 + np.exp(-x))


def np_rms_norm(x, w, eps=1e-5):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def np_rope(x, pos, theta):
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    inv = theta ** (-2.0 * np.arange(d // 2) / d)
    ang = np.asarray(pos, np.float64)[..., None] * inv  # [..., T, D/2]
    c, s = np.cos(ang), np.sin(ang)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def np_attention(q, k, v, mask=None):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return np_softmax(s) @ v


def np_mhsa(x, wq, wk, wv, wo, h, theta=None, pos=None):
    x = np.asarray(x, np.float64)
    t, c = x.shape[-2:]
    d = c // h

    def split(a):  # [..., T, C] -> [..., H, T, D]
        return np.swapaxes(a.reshape(a.shape[:-1] + (h, d)), -2, -3)

    q, k, v = split(x @ wq.T), split(x @ wk.T), split(x @ wv.T)
    if theta is not None:
        p = np.arange(t) if pos is None else np.asarray(pos)
        if p.ndim > 1:
            p = p[..., None, :]  # [..., 1, T]: shared by the heads
        q, k = np_rope(q, p, theta), np_rope(k, p, theta)
    y = np_attention(q, k, v, np.tril(np.ones((t, t), bool)))
    y = np.swapaxes(y, -2, -3).reshape(x.shape)
    return y @ wo.T
