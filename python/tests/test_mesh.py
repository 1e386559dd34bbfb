"""The mesh from Python: validation raising ValueError, and ShardedModel's physical layout (which device
holds which slice of every parameter and moment), checked against the unsharded model, as the seed's
test_sharding.py does with JAX's simulated devices."""

import numpy as np
import pytest

import loom

LLAMA = {"arch": "llama", "vocab_size": 64, "context_length": 16, "d_model": 32, "num_layers": 2, "num_heads": 4,
         "num_kv_heads": 0, "d_ff": 64}
GPT2 = {"arch": "gpt2", "vocab_size": 64, "context_length": 16, "d_model": 32, "num_layers": 2, "num_heads": 4,
        "dropout": 0.0}

# The table for loom's [out, in] weights, by parameter name.
def expected_spec(name, mode, ndim):
    base = name.replace(".exp_avg_sq", "").replace(".exp_avg", "")
    d = "data" if mode in ("fsdp", "fsdp_tp") else None
    t = "tensor" if mode in ("tp", "fsdp_tp") else None
    leaf = base.split(".")[-2] if "." in base else base
    kind = base.split(".")[-1]
    if leaf in ("q_proj", "k_proj", "v_proj", "w1", "w3", "fc"):
        return (t, d) if kind == "weight" else (t,)
    if leaf in ("output_proj", "w2", "proj"):
        return (d, t) if kind == "weight" else (d,)
    if leaf in ("token_embeddings", "position_embeddings", "lm_head"):
        return (None, t)
    return (None,) * ndim


def test_validation_raises_value_error():
    with pytest.raises(ValueError, match="unknown parallel mode \"zero3\""):
        loom.validate_mode("zero3")
    with pytest.raises(ValueError, match="needs tensor=1"):
        loom.validate_mesh_for_mode(loom.Mesh(data=2, tensor=2), "dp")
    with pytest.raises(ValueError, match="needs tensor=1"):
        loom.validate_mesh_for_mode(loom.Mesh(data=2, tensor=2), "fsdp")
    with pytest.raises(ValueError, match="needs data=1"):
        loom.validate_mesh_for_mode(loom.Mesh(data=2, tensor=2), "tp")
    with pytest.raises(ValueError, match="data > 1 and tensor > 1"):
        loom.validate_mesh_for_mode(loom.Mesh(data=1, tensor=2), "fsdp_tp")
    with pytest.raises(ValueError, match="needs 8 ranks"):
        loom.validate_mesh_for_devices(loom.Mesh(data=4, tensor=2), 4)
    with pytest.raises(ValueError, match="does not divide by the tensor axis"):
        loom.ShardedModel(dict(LLAMA, d_ff=66), loom.Mesh(tensor=4), "tp")
    with pytest.raises(ValueError):
        loom.Mesh(data=0)
    loom.validate_mesh_for_mode(loom.Mesh(data=4, tensor=2), "fsdp_tp")
    assert loom.Mesh.parse("data=4,tensor=2").shape == (4, 2)
    assert loom.batch_spec("tp") == (None, None) and loom.batch_spec("fsdp_tp") == ("data", None)


@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("mode,shape", [("dp", (2, 1)), ("fsdp", (4, 1)), ("tp", (1, 4)), ("fsdp_tp", (2, 2))])
def test_every_device_holds_its_slice(config, mode, shape):
    mesh = loom.Mesh(*shape)
    whole = loom.Model.from_config(config, seed=3).state_dict()
    sharded = loom.ShardedModel(config, mesh, mode, seed=3)
    layout = sharded.layout()
    assert set(layout) == {n + s for n in whole for s in ("", ".exp_avg", ".exp_avg_sq")}
    for name, t in layout.items():
        base = name.replace(".exp_avg_sq", "").replace(".exp_avg", "")
        glob = whole[base]
        assert t["global_shape"] == glob.shape
        assert t["spec"] == expected_spec(name, mode, glob.ndim), name
        assert [s["device"] for s in t["shards"]] == list(range(mesh.size))
        cover = np.zeros(glob.shape, dtype=np.int64)
        for s in t["shards"]:
            coords = dict(zip(("data", "tensor"), mesh.coords(s["device"])))
            sizes = {"data": mesh.data, "tensor": mesh.tensor}
            for dim, axis in enumerate(t["spec"]):
                n = glob.shape[dim] // (sizes[axis] if axis else 1)
                assert s["array"].shape[dim] == n
                assert s["offset"][dim] == (coords[axis] * n if axis else 0)
            block = tuple(slice(o, o + k) for o, k in zip(s["offset"], s["array"].shape))
            cover[block] += 1
            if name == base:  # the values are this device's slice of the unsharded model's
                np.testing.assert_array_equal(s["array"], glob[block])
            else:
                assert not s["array"].any()  # moments start at zero
        assert (cover == cover.flat[0]).all() and cover.flat[0] * np.prod(
            [glob.shape[d] // t["shards"][0]["array"].shape[d] for d in range(glob.ndim)]) == mesh.size


def test_training_matches_one_process():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, size=(4, 8)).astype(np.int32)
    targets = rng.integers(0, 64, size=(4, 8)).astype(np.int32)
    ref = loom.ShardedModel(LLAMA, loom.Mesh(), "dp", seed=5)
    sharded = loom.ShardedModel(LLAMA, loom.Mesh(data=2, tensor=2), "fsdp_tp", seed=5)
    for _ in range(3):
        a, b = ref.step(ids, targets), sharded.step(ids, targets)
        assert abs(a - b) <= 1e-5 * abs(a)
    # After steps the moments are non-zero and still sharded like their parameter.
    m = sharded.layout()["layers.0.attn.q_proj.weight.exp_avg"]
    assert m["spec"] == ("tensor", "data") and all(s["array"].shape == (16, 16) and s["array"].any() for s in m["shards"])


def test_overlap_changes_no_bit():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 64, size=(4, 8)).astype(np.int32)
    targets = rng.integers(0, 64, size=(4, 8)).astype(np.int32)
    on = loom.ShardedModel(LLAMA, loom.Mesh(data=4), "fsdp", seed=2)
    off = loom.ShardedModel(LLAMA, loom.Mesh(data=4), "fsdp", seed=2, overlap=False)
    for _ in range(3):  # step 1 learns the prefetch order; 2 and 3 prefetch
        assert on.step(ids, targets) == off.step(ids, targets)
    a, b = on.layout(), off.layout()
    for name in a:
        for x, y in zip(a[name]["shards"], b[name]["shards"]):
            assert np.array_equal(x["array"], y["array"]), name
