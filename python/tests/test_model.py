"""TransformerLM and TransformerBlock against the PyTorch model in tests/models/llama/fixtures (float64 oracle)."""

import numpy as np
import pytest

import loom
from conftest import lm_config, lm_weights, np_mhsa, np_rms_norm, np_silu


@pytest.fixture()
def model(lm_fixture):
    return loom.TransformerLM(**lm_config(lm_fixture), weights=lm_weights(lm_fixture))


def test_names_and_config(model, lm_fixture):
    assert set(model.parameter_names()) == set(lm_weights(lm_fixture))
    c = model.config
    assert c["d_model"] == 24 and c["num_layers"] == 2 and c["vocab_size"] == 37
    assert model.num_params == sum(v.size for v in lm_weights(lm_fixture).values())


def test_forward_loss_grads(model, lm_fixture):
    ids, targets = lm_fixture["ids"], lm_fixture["targets"]
    logits = model.forward(ids.astype(np.int64))
    assert logits.shape == (2, 9, 37) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, lm_fixture["logits"], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(model(ids[0]), lm_fixture["logits"][0], rtol=1e-3, atol=1e-3)  # [T] input
    ref_loss = float(lm_fixture["loss"][0])
    assert abs(model.loss(ids, targets) - ref_loss) < 1e-4
    loss, grads = model.loss_and_grads(ids, targets)
    assert abs(loss - ref_loss) < 1e-4
    assert set(grads) == set(model.parameter_names())
    for name, g in grads.items():
        np.testing.assert_allclose(g, lm_fixture["grad." + name], rtol=1e-3, atol=1e-4, err_msg=name)
    # Gradients do not accumulate across calls.
    _, again = model.loss_and_grads(ids, targets)
    np.testing.assert_allclose(again["lm_head.weight"], grads["lm_head.weight"], rtol=1e-6, atol=1e-7)


def test_state_dict_copies_and_parameters_are_live(model, lm_fixture):
    sd = model.state_dict()
    sd["lm_head.weight"][:] = 0  # a copy: the model is unchanged
    np.testing.assert_array_equal(model.state_dict()["lm_head.weight"], lm_fixture["init.lm_head.weight"])
    live = model.parameters()
    live["lm_head.weight"][:] = 0  # a view: the model changes
    assert np.all(model.forward(lm_fixture["ids"]) == 0)


def test_load_state_dict_errors(model, lm_fixture):
    w = lm_weights(lm_fixture)
    bad = dict(w)
    bad["lm_head.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="lm_head.weight"):
        model.load_state_dict(bad)
    missing = dict(w)
    del missing["ln_final.weight"]
    with pytest.raises(ValueError, match="ln_final.weight"):
        model.load_state_dict(missing)
    model.load_state_dict(missing, strict=False)


def test_forward_errors(model):
    with pytest.raises(ValueError, match="37"):
        model.forward(np.array([[1, 37]]))  # id outside the vocabulary
    with pytest.raises(ValueError):
        model.forward(np.zeros((1, 17), np.int64))  # longer than context_length 16
    with pytest.raises(ValueError):
        loom.TransformerLM(vocab_size=10, context_length=8, d_model=10, num_layers=1, num_heads=3, d_ff=8)


def test_save_load_and_generate(model, lm_fixture, tmp_path):
    path = tmp_path / "model.safetensors"
    model.save(path)
    back = loom.TransformerLM.load(path)
    assert back.config == model.config
    np.testing.assert_array_equal(back.forward(lm_fixture["ids"]), model.forward(lm_fixture["ids"]))
    prompt = [1, 2, 3]
    greedy = model.generate(prompt, max_new_tokens=5, temperature=0.0)
    assert len(greedy) == 5
    # Greedy decoding through the KV cache equals argmax of full forward passes.
    seq = list(prompt)
    for _ in range(5):
        seq.append(int(np.argmax(model.forward(np.array(seq))[-1])))
    assert greedy == seq[3:]
    a = model.generate(prompt, max_new_tokens=8, temperature=1.0, seed=3)
    assert a == model.generate(prompt, max_new_tokens=8, temperature=1.0, seed=3)
    assert all(0 <= t < 37 for t in a)
    stop = greedy[0]
    assert model.generate(prompt, max_new_tokens=5, temperature=0.0, stop_token=stop) == [stop]


def test_transformer_block_against_numpy():
    rng = np.random.default_rng(1)
    d, h, f, t = 16, 4, 24, 7
    block = loom.TransformerBlock(d, h, f, max_seq_len=32, rope_theta=10000.0, seed=5)
    names = set(block.parameter_names())
    assert names == {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight",
                     "ln1.weight", "ln2.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"}
    w = {n: (rng.standard_normal(v.shape) * 0.3 + (1.0 if n.startswith("ln") else 0.0)).astype(np.float32)
         for n, v in block.state_dict().items()}
    block.load_state_dict(w)
    x = rng.standard_normal((2, t, d)).astype(np.float32)
    hh = x + np_mhsa(np_rms_norm(x, w["ln1.weight"]), w["attn.q_proj.weight"], w["attn.k_proj.weight"],
                     w["attn.v_proj.weight"], w["attn.output_proj.weight"], h, theta=10000.0)
    n2 = np_rms_norm(hh, w["ln2.weight"])
    ref = hh + (np_silu(n2 @ w["ffn.w1.weight"].T) * (n2 @ w["ffn.w3.weight"].T)) @ w["ffn.w2.weight"].T
    np.testing.assert_allclose(block.forward(x), ref, rtol=1e-4, atol=1e-4)
    pos = np.arange(t) * 2  # not a shift: RoPE only sees relative positions
    ref_shift = block.forward(x, positions=pos)
    assert not np.allclose(ref_shift, block.forward(x))  # positions matter
    np.testing.assert_allclose(block(x[None], positions=pos), ref_shift[None], rtol=1e-5, atol=1e-6)


def test_from_config_and_seeded_init(lm_fixture):
    cfg = dict(lm_config(lm_fixture), unrelated_key=1)  # a training config's "model" section has extra keys
    a = loom.TransformerLM.from_config(cfg, seed=3)
    b = loom.TransformerLM(**lm_config(lm_fixture), seed=3)
    c = loom.TransformerLM.from_config(cfg, seed=4)
    assert a.config == b.config
    for name, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[name])
    assert not np.array_equal(a.state_dict()["lm_head.weight"], c.state_dict()["lm_head.weight"])
    w = a.state_dict()["lm_head.weight"]  # truncated normal, std sqrt(2 / (in + out)), cut at 3 std
    std = np.sqrt(2.0 / (24 + 37))
    assert abs(w.std() - std) < 0.2 * std and np.abs(w).max() <= 3 * std + 1e-6
    np.testing.assert_array_equal(a.state_dict()["ln_final.weight"], np.ones(24, np.float32))


def test_grouped_query_attention(tmp_path):
    # 4 query heads over 2 key/value heads: k_proj and v_proj produce 2 heads of 8.
    m = loom.TransformerLM(vocab_size=20, context_length=8, d_model=32, num_layers=1, num_heads=4, d_ff=48,
                           num_kv_heads=2, seed=3)
    assert m.config["num_kv_heads"] == 2
    assert m.state_dict()["layers.0.attn.k_proj.weight"].shape == (16, 32)
    ids = np.array([[1, 5, 7, 2]])
    logits = m.forward(ids)
    assert logits.shape == (1, 4, 20) and np.isfinite(logits).all()
    m.save(tmp_path / "gqa.safetensors")
    back = loom.TransformerLM.load(tmp_path / "gqa.safetensors")
    assert back.config == m.config
    np.testing.assert_array_equal(back.forward(ids), logits)
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        loom.TransformerLM(vocab_size=20, context_length=8, d_model=32, num_layers=1, num_heads=4, d_ff=48,
                           num_kv_heads=3)


def test_models_past_the_memory_budget_are_refused_before_allocating():
    # Issue 32's Python harness: a vocab_size of 2^31-1 was "could not allocate 137438953408 bytes"; the
    # model's memory is held to the CLI's budget (MemAvailable, the cgroup, RLIMIT_AS/RLIMIT_DATA) first.
    with pytest.raises(ValueError, match="TransformerLM: needs an estimated .* GiB.*model.vocab_size=2147483647"):
        loom.TransformerLM(2**31 - 1, 16, 16, 1, 2, 32)
    with pytest.raises(ValueError, match="Model.from_config: needs an estimated .*model.vocab_size=2147483647"):
        loom.Model.from_config({"arch": "gpt2", "vocab_size": 2**31 - 1})
    with pytest.raises(ValueError, match="TransformerBlock: d_model=1048576, d_ff=16 and max_seq_len=8 need"):
        loom.TransformerBlock(2**20, 2, 16, 8)
