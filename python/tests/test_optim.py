"""AdamW, clipping and the cosine schedule: PyTorch's trajectory from tests/models/llama/fixtures, and numpy."""

import math

import numpy as np
import pytest

import loom
from conftest import lm_config, lm_weights


def np_adamw(p, g, m, v, t, lr, b1, b2, eps, wd):
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


def test_adamw_matches_numpy_and_skips_none():
    rng = np.random.default_rng(0)
    p = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    ref = [a.astype(np.float64) for a in p]
    m = [np.zeros_like(a) for a in ref]
    v = [np.zeros_like(a) for a in ref]
    opt = loom.AdamW(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    frozen = p[1].copy()
    for t in range(1, 4):
        g = rng.standard_normal((3, 4)).astype(np.float32)
        opt.step(p, [g, None])
        ref[0], m[0], v[0] = np_adamw(ref[0], g.astype(np.float64), m[0], v[0], t, 0.01, 0.9, 0.99, 1e-8, 0.1)
    np.testing.assert_allclose(p[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p[1], frozen)  # no gradient: untouched
    s = opt.state_dict()
    assert s["step"] == 3 and opt.step_count == 3
    np.testing.assert_allclose(s["exp_avg"][0], m[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s["exp_avg_sq"][0], v[0], rtol=1e-5, atol=1e-7)
    assert s["exp_avg"][1] is None


def test_adamw_state_restores_exactly():
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(4)]
    a = [np.ones(6, np.float32)]
    opt = loom.AdamW(lr=0.1)
    for g in grads[:2]:
        opt.step(a, [g])
    saved, a_saved = opt.state_dict(), a[0].copy()
    for g in grads[2:]:
        opt.step(a, [g])
    b = [a_saved]
    opt2 = loom.AdamW(lr=0.1)
    opt2.load_state_dict(saved)
    for g in grads[2:]:
        opt2.step(b, [g])
    np.testing.assert_array_equal(a[0], b[0])
    assert opt2.step_count == 4


def test_adamw_rejects_arrays_it_cannot_update():
    opt = loom.AdamW()
    with pytest.raises(ValueError, match="float32"):
        opt.step([np.ones(3)], [np.ones(3)])  # float64 parameter
    with pytest.raises(ValueError, match="shape"):
        opt.step([np.ones(3, np.float32)], [np.ones(4, np.float32)])
    with pytest.raises(ValueError):
        loom.AdamW(lr=-1.0)


def test_training_loop_matches_torch_adamw(lm_fixture):
    """Five steps of loss_and_grads + AdamW.step on the live parameters reproduce torch.optim.AdamW."""
    model = loom.TransformerLM(**lm_config(lm_fixture), weights=lm_weights(lm_fixture))
    opt = loom.AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    params = model.parameters()
    losses = []
    for step in range(5):
        loss, grads = model.loss_and_grads(lm_fixture[f"adamw.ids.{step}"], lm_fixture[f"adamw.targets.{step}"])
        opt.step(params, grads)
        losses.append(loss)
    np.testing.assert_allclose(losses, lm_fixture["adamw.losses"], rtol=1e-4, atol=1e-4)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, lm_fixture["adamw.final." + name], rtol=1e-3, atol=1e-4, err_msg=name)


def test_clip_grad_norm_against_torch(lm_fixture):
    names = list(lm_weights(lm_fixture))
    grads = [lm_fixture["grad." + n].astype(np.float32).copy() for n in names]
    norm = loom.clip_grad_norm(grads + [None], 0.5)
    assert abs(norm - float(lm_fixture["clip.norm"][0])) < 1e-4 * norm
    np.testing.assert_allclose(grads[names.index("lm_head.weight")], lm_fixture["clip.lm_head"], rtol=1e-5, atol=1e-7)
    total = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    assert abs(total - 0.5) < 1e-4
    small = [np.full(4, 0.01, np.float32)]
    loom.clip_grad_norm(small, 1.0)  # under the limit: unchanged
    np.testing.assert_array_equal(small[0], np.full(4, 0.01, np.float32))


def test_cosine_lr():
    def ref(t, hi, lo, w, c):
        if t < w:
            return t / w * hi
        if t <= c:
            return lo + 0.5 * (1 + math.cos((t - w) / (c - w) * math.pi)) * (hi - lo)
        return lo

    for t in range(0, 30):
        assert abs(loom.cosine_lr(t, 1.0, 0.1, 7, 21) - ref(t, 1.0, 0.1, 7, 21)) < 1e-6
    assert loom.cosine_lr(0, 1.0, 0.1, 7, 21) == 0.0
    assert abs(loom.cosine_lr(7, 1.0, 0.1, 7, 21) - 1.0) < 1e-7
