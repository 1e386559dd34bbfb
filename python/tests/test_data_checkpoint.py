"""get_batch (CS336 semantics, devices) and checkpoints (weights, optimizer state, iteration)."""

import numpy as np
import pytest

import loom
from conftest import lm_config, lm_weights


def test_get_batch_windows():
    data = np.arange(100, dtype=np.uint16)
    x, y = loom.get_batch(data, batch_size=32, context_length=10, seed=1)
    assert x.shape == (32, 10) and y.shape == (32, 10) and x.dtype == np.int64
    np.testing.assert_array_equal(y, x + 1)  # targets are the next tokens
    np.testing.assert_array_equal(x, x[:, :1] + np.arange(10))  # contiguous windows
    assert x.min() >= 0 and y.max() <= 99


def test_get_batch_covers_every_start_uniformly():
    data = np.arange(20, dtype=np.int64)
    starts = np.concatenate([loom.get_batch(data, 64, 5, seed=3, index=i)[0][:, 0] for i in range(200)])
    counts = np.bincount(starts, minlength=20)
    assert set(np.nonzero(counts)[0]) == set(range(15))  # s in [0, n - T - 1] = [0, 14]
    expected = len(starts) / 15
    assert np.all(np.abs(counts[:15] - expected) < 5 * np.sqrt(expected))


def test_get_batch_randomness():
    data = np.arange(1000)
    a, _ = loom.get_batch(data, 8, 16, seed=5, index=2)
    b, _ = loom.get_batch(data, 8, 16, seed=5, index=2)
    c, _ = loom.get_batch(data, 8, 16, seed=5, index=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.random.seed(0)
    d, _ = loom.get_batch(data, 8, 16)
    np.random.seed(0)
    e, _ = loom.get_batch(data, 8, 16)
    np.testing.assert_array_equal(d, e)


def test_get_batch_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(500, dtype=np.uint16).tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = loom.get_batch(mm, 4, 8, seed=0)
    np.testing.assert_array_equal(y, x + 1)


def test_get_batch_devices_and_errors():
    data = np.arange(100)
    with pytest.raises(RuntimeError, match="cuda:0"):
        loom.get_batch(data, 2, 4, device="cuda:0")
    with pytest.raises(RuntimeError):
        loom.get_batch(data, 2, 4, device="mps")
    with pytest.raises(ValueError):
        loom.get_batch(data, 2, 4, device="tpu!")
    with pytest.raises(ValueError, match="context_length"):
        loom.get_batch(np.arange(10), 2, 10)


def test_checkpoint_round_trip(lm_fixture, tmp_path):
    cfg = lm_config(lm_fixture)
    model = loom.TransformerLM(**cfg, weights=lm_weights(lm_fixture))
    opt = loom.AdamW(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    params = model.parameters()
    batches = [(lm_fixture[f"adamw.ids.{i}"], lm_fixture[f"adamw.targets.{i}"]) for i in range(5)]
    for x, y in batches[:3]:
        opt.step(params, model.loss_and_grads(x, y)[1])
    path = tmp_path / "ckpt.safetensors"
    loom.save_checkpoint(model, opt, 3, path)
    for x, y in batches[3:]:
        opt.step(params, model.loss_and_grads(x, y)[1])
    # Resume into a fresh model and optimizer: the same two steps give the same weights, bit for bit.
    model2 = loom.TransformerLM(**cfg, seed=99)
    opt2 = loom.AdamW(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    assert loom.load_checkpoint(path, model2, opt2) == 3
    assert opt2.step_count == 3
    params2 = model2.parameters()
    for x, y in batches[3:]:
        opt2.step(params2, model2.loss_and_grads(x, y)[1])
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(model2.state_dict()[name], value, err_msg=name)
    # The file is plain safetensors with prefixed names.
    tensors, meta = loom.load_safetensors(path)
    assert meta["loom.iteration"] == "3"
    assert "model.lm_head.weight" in tensors and "optimizer.exp_avg.0" in tensors


def test_checkpoint_errors(tmp_path):
    loom.save_safetensors(tmp_path / "plain.safetensors", {"w": np.ones(3, np.float32)})
    block = loom.TransformerBlock(8, 2, 16, 16)
    with pytest.raises(ValueError, match="iteration"):
        loom.load_checkpoint(tmp_path / "plain.safetensors", block)
    with pytest.raises(OSError):
        loom.load_checkpoint(tmp_path / "missing.safetensors", block)
    loom.save_checkpoint(block, None, 7, tmp_path / "block.safetensors")
    other = loom.TransformerBlock(8, 2, 16, 16, seed=1)
    assert loom.load_checkpoint(tmp_path / "block.safetensors", other) == 7
    for k, v in block.state_dict().items():
        np.testing.assert_array_equal(other.state_dict()[k], v)


def test_safetensors_keeps_dtypes(tmp_path):
    arrays = {"f": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3), "i": np.arange(-2, 3, dtype=np.int32),
              "u": np.arange(4, dtype=np.uint16), "b": np.array([True, False, True])}
    loom.save_safetensors(tmp_path / "a.safetensors", arrays, {"note": "hi"})
    back, meta = loom.load_safetensors(tmp_path / "a.safetensors")
    assert meta["note"] == "hi"
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype, k
        np.testing.assert_array_equal(back[k], v)
