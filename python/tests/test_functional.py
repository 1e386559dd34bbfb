"""Functional ops against float64 numpy oracles, with leading batch dimensions and error mapping."""

import numpy as np
import pytest

import loom
from conftest import load_fixture, np_attention, np_mhsa, np_rms_norm, np_rope, np_silu, np_softmax

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_linear_leading_dims_and_float64_input():
    x, w = randn(2, 3, 5), randn(7, 5)
    y = loom.linear(x.astype(np.float64), w)
    assert y.dtype == np.float32 and y.shape == (2, 3, 7)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_linear_shape_error_is_value_error():
    with pytest.raises(ValueError, match="5|4"):
        loom.linear(randn(3, 5), randn(7, 4))


def test_embedding_any_id_dtype():
    table = randn(10, 4)
    ids = np.array([[1, 9, 0], [3, 3, 2]], dtype=np.int64)
    np.testing.assert_array_equal(loom.embedding(ids, table), table[ids])
    np.testing.assert_array_equal(loom.embedding(ids.astype(np.uint16), table), table[ids])
    with pytest.raises(ValueError, match="10"):
        loom.embedding(np.array([10]), table)
    with pytest.raises(ValueError):
        loom.embedding(np.array([2**40]), table)  # does not fit int32


def test_silu_and_softmax():
    x = randn(2, 3, 4)
    np.testing.assert_allclose(loom.silu(x), np_silu(x), rtol=1e-5, atol=1e-6)
    for dim in (-1, 0, 1):
        np.testing.assert_allclose(loom.softmax(x, dim), np_softmax(x, dim), rtol=1e-5, atol=1e-6)
    big = np.array([1000.0, 1001.0, 999.0], np.float32)  # stable: no overflow
    np.testing.assert_allclose(loom.softmax(big), np_softmax(big), rtol=1e-5)


def test_rms_norm_against_numpy_and_fixture():
    x, w = randn(2, 3, 8), randn(8)
    np.testing.assert_allclose(loom.rms_norm(x, w, 1e-5), np_rms_norm(x, w), rtol=1e-4, atol=1e-5)
    fx = load_fixture("ops/fixtures/rms_norm.json")
    # Plain rms_norm cases (the fused add + rms_norm ones have a .residual and no .eps).
    cases = sorted(k[:-2] for k in fx if k.endswith(".x") and k[:-2] + ".eps" in fx)
    assert cases, "the rms_norm fixture has cases"
    for c in cases:
        eps = float(fx[c + ".eps"].reshape(-1)[0])
        np.testing.assert_allclose(loom.rms_norm(fx[c + ".x"], fx[c + ".weight"], eps), fx[c + ".y"],
                                   rtol=1e-4, atol=1e-4)


def test_swiglu():
    x, w1, w2, w3 = randn(2, 5, 8), randn(12, 8), randn(8, 12), randn(12, 8)
    x64 = x.astype(np.float64)
    ref = (np_silu(x64 @ w1.T) * (x64 @ w3.T)) @ w2.T
    np.testing.assert_allclose(loom.swiglu(x, w1, w2, w3), ref, rtol=1e-4, atol=1e-4)


def test_scaled_dot_product_attention_masks():
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)
    np.testing.assert_allclose(loom.scaled_dot_product_attention(q, k, v), np_attention(q, k, v),
                               rtol=1e-4, atol=1e-5)
    mask = rng.random((4, 6)) > 0.3
    mask[:, 0] = True
    np.testing.assert_allclose(loom.scaled_dot_product_attention(q, k, v, mask), np_attention(q, k, v, mask),
                               rtol=1e-4, atol=1e-5)
    full = rng.random((2, 3, 4, 6)) > 0.5
    full[..., 1] = True
    np.testing.assert_allclose(loom.scaled_dot_product_attention(q, k, v, full), np_attention(q, k, v, full),
                               rtol=1e-4, atol=1e-5)
    # A mask broadcast over the heads ([B, 1, Tq, Tk]).
    bmask = full[:, :1]
    np.testing.assert_allclose(loom.scaled_dot_product_attention(q, k, v, bmask),
                               np_attention(q, k, v, np.broadcast_to(bmask, full.shape)), rtol=1e-4, atol=1e-5)
    # A query that may attend nothing gets zeros, not NaN.
    none = np.ones((4, 6), bool)
    none[2] = False
    y = loom.scaled_dot_product_attention(q, k, v, none)
    assert np.all(y[..., 2, :] == 0) and np.isfinite(y).all()


def test_rope_interleaved_positions():
    x = randn(2, 5, 8)
    pos = np.array([0, 3, 1, 7, 2])
    np.testing.assert_allclose(loom.rope(x, pos, 10000.0), np_rope(x, pos, 10000.0), rtol=1e-4, atol=1e-5)
    bpos = np.array([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])
    np.testing.assert_allclose(loom.rope(x, bpos, 500.0), np_rope(x, bpos, 500.0), rtol=1e-4, atol=1e-5)
    # rotate_half pairs (x[i], x[i+D/2]): the interleaved rotation of a permuted vector.
    perm = np.stack([np.arange(4), np.arange(4) + 4], -1).reshape(-1)  # 0,4,1,5,...
    half = loom.rope(x, pos, 10000.0, style="rotate_half")
    np.testing.assert_allclose(half[..., perm], np_rope(x[..., perm], pos, 10000.0), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        loom.rope(randn(2, 5, 7), pos)  # odd head dimension


def test_rope_against_fixture():
    # PyTorch values from tests/ops/fixtures/make_attention_fixtures.py (thetas as in its case list).
    fx = load_fixture("ops/fixtures/rope.json")
    cases = {"shared_interleaved": (10000.0, "interleaved"), "shared_half": (10000.0, "rotate_half"),
             "perrow_interleaved": (500.0, "interleaved"), "perrow_half": (10000.0, "rotate_half"),
             "long_interleaved": (10000.0, "interleaved")}
    for c, (theta, style) in cases.items():
        np.testing.assert_allclose(loom.rope(fx[c + "_x"], fx[c + "_pos"], theta, style), fx[c + "_y"],
                                   rtol=1e-4, atol=1e-4, err_msg=c)


@pytest.mark.parametrize("theta", [None, 10000.0])
def test_multihead_self_attention(theta):
    x = randn(2, 6, 16)
    ws = [randn(16, 16) * 0.3 for _ in range(4)]
    ref = np_mhsa(x, *ws, h=4, theta=theta)
    y = loom.multihead_self_attention(x, *ws, num_heads=4, theta=theta)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # Extra leading dimensions and per-sequence positions.
    x3 = randn(2, 3, 6, 16)
    pos = rng.integers(0, 20, size=(2, 3, 6)) if theta else None
    np.testing.assert_allclose(loom.multihead_self_attention(x3, *ws, num_heads=4, theta=theta, positions=pos),
                               np_mhsa(x3, *ws, h=4, theta=theta, pos=pos), rtol=1e-4, atol=1e-4)
    # Causal: the first position's output depends on the first token only.
    x2 = x.copy()
    x2[:, 1:] = randn(2, 5, 16)
    y2 = loom.multihead_self_attention(x2, *ws, num_heads=4, theta=theta)
    np.testing.assert_allclose(y2[:, 0], y[:, 0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        loom.multihead_self_attention(x, *ws, num_heads=5)


def test_cross_entropy():
    logits = randn(2, 3, 11) * 3
    targets = rng.integers(0, 11, size=(2, 3))
    lp = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    ref = -np.take_along_axis(lp, targets[..., None], -1).mean()
    assert abs(loom.cross_entropy(logits, targets) - ref) < 1e-5
    t2 = targets.copy()
    t2[0, 0] = -100
    mask = t2 != -100
    ref2 = -np.take_along_axis(lp, np.where(mask, t2, 0)[..., None], -1)[..., 0][mask].mean()
    assert abs(loom.cross_entropy(logits, t2) - ref2) < 1e-5
    with pytest.raises(ValueError, match="11"):
        loom.cross_entropy(logits, np.full((2, 3), 11))
    fx = load_fixture("ops/fixtures/cross_entropy.json")
    cases = sorted({k.rsplit("_", 1)[0] for k in fx if k.endswith("_logits")})
    assert cases
    for c in cases:
        if c + "_loss" in fx and c + "_targets" in fx:
            assert abs(loom.cross_entropy(fx[c + "_logits"], fx[c + "_targets"]) - float(fx[c + "_loss"].reshape(-1)[0])) < 1e-4


# Issue 32: 0-d arrays came back as shape (1,) (np.ascontiguousarray makes them 1-d), and products with a
# zero side failed with a BLAS leading-dimension message instead of giving numpy's result.
def test_zero_d_arrays_keep_their_shape():
    for x in (np.float32(3.0), np.array(-2.0), 1.5):
        y = loom.silu(x)
        assert y.shape == ()
        np.testing.assert_allclose(y, np.float32(x) / (1 + np.exp(-np.float32(x))), rtol=1e-6)
    assert loom.embedding(np.array(2), np.arange(12, dtype=np.float32).reshape(4, 3)).shape == (3,)
    with pytest.raises(ValueError, match="softmax: x must have at least one dimension"):
        loom.softmax(np.array(1.0))


@pytest.mark.parametrize("m,k,n", [(2, 0, 3), (0, 4, 3), (2, 4, 0), (0, 0, 0)])
def test_zero_sided_products_match_numpy(m, k, n):
    x, w = np.ones((m, k), np.float32), np.ones((n, k), np.float32)
    y = loom.linear(x, w)
    assert y.shape == (m, n)
    np.testing.assert_array_equal(y, x @ w.T)
    w1, w3, w2 = np.ones((n, k), np.float32), np.ones((n, k), np.float32), np.ones((k, n), np.float32)
    assert loom.swiglu(x, w1, w2, w3).shape == (m, k)
