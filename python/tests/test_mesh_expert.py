"""Expert parallelism from Python: the expert mesh axis, dp_ep / fsdp_ep, their validation as ValueError,
and a DeepSeek-V3 ShardedModel whose routed experts are split over the expert axis (each device holds
n_routed / expert whole experts), trained step for step like one process."""

import numpy as np
import pytest

import loom

# configs/dsv3-tiny.json's shape (1 dense + 1 MoE layer, 4 routed experts, top 2, MTP), a 64-token
# vocabulary to keep it fast.
DSV3 = {"arch": "deepseek_v3", "vocab_size": 64, "context_length": 16, "d_model": 32, "num_layers": 2, "n_dense": 1,
        "num_heads": 2, "q_rank": 16, "kv_rank": 8, "d_nope": 8, "d_rope": 4, "d_v": 8, "d_ff": 64, "n_shared": 1,
        "n_routed": 4, "top_k": 2, "d_expert": 16, "route_scale": 1.0, "gamma": 0.001, "alpha_seq": 0.0001,
        "n_mtp": 1, "mtp_lambda": 0.3}
ROUTED = ("experts.w1", "experts.w2", "experts.w3")


def is_routed(name):
    return any(k in name for k in ROUTED)


def test_expert_axis_and_validation():
    mesh = loom.Mesh(data=2, expert=2)
    assert (mesh.data, mesh.tensor, mesh.expert, mesh.size) == (2, 1, 2, 4)
    assert mesh.shape == (2, 1, 2) and str(mesh) == "data=2,tensor=1,expert=2"
    assert loom.Mesh.parse("expert=4,data=2").shape == (2, 1, 4)
    assert loom.Mesh(data=4, tensor=2).shape == (4, 2)  # no expert axis: the two-axis shape as before
    # Ranks: expert fastest after tensor (rank = d * expert + e here).
    assert [mesh.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert [mesh.coord(r, "expert") for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown axis \"pipe\""):
        mesh.coord(0, "pipe")
    with pytest.raises(ValueError, match="expert=0"):
        loom.Mesh(expert=0)
    for mode in ("dp_ep", "fsdp_ep"):
        assert mode in loom.MODES
        loom.validate_mode(mode)
        loom.validate_mesh_for_mode(mesh, mode)
        needs = f"parallel mode {mode} needs tensor=1 and expert > 1, but the mesh is"
        with pytest.raises(ValueError, match=needs + " data=2,tensor=1 \\("):
            loom.validate_mesh_for_mode(loom.Mesh(data=2), mode)
        with pytest.raises(ValueError, match="needs tensor=1 and expert > 1, but the mesh is data=1,tensor=2,expert=2"):
            loom.validate_mesh_for_mode(loom.Mesh(tensor=2, expert=2), mode)
        assert loom.batch_spec(mode) == (("data", "expert"), None)  # rows over data x expert
    with pytest.raises(ValueError, match="parallel mode fsdp needs expert=1, but the mesh is data=2,tensor=1,expert=2"):
        loom.validate_mesh_for_mode(mesh, "fsdp")
    with pytest.raises(ValueError, match="model.n_routed=6 does not divide by expert=4"):
        loom.validate_experts_for_mesh(6, loom.Mesh(expert=4), "dp_ep")
    loom.validate_experts_for_mesh(6, loom.Mesh(data=4), "dp")  # no expert axis: nothing to divide
    with pytest.raises(ValueError, match="model.n_routed=4 does not divide by expert=8"):
        loom.ShardedModel(DSV3, loom.Mesh(expert=8), "dp_ep")
    with pytest.raises(ValueError, match="max_expert_rows=-1: must be in \\[0, "):
        loom.ShardedModel(DSV3, mesh, "dp_ep", max_expert_rows=-1)


@pytest.mark.parametrize("mode,shape", [("dp_ep", dict(expert=4)), ("dp_ep", dict(data=2, expert=2)),
                                        ("fsdp_ep", dict(data=2, expert=2))])
def test_every_device_holds_its_experts(mode, shape):
    mesh = loom.Mesh(**shape)
    whole = loom.Model.from_config(DSV3, seed=3).state_dict()
    layout = loom.ShardedModel(DSV3, mesh, mode, seed=3).layout()
    assert set(layout) == {n + s for n in whole for s in ("", ".exp_avg", ".exp_avg_sq")}
    sizes = {"data": mesh.data, "tensor": mesh.tensor, "expert": mesh.expert}

    def size(axis):  # an axis name, or a tuple of axes folded into one dimension
        return int(np.prod([sizes[a] for a in axis])) if isinstance(axis, tuple) else sizes[axis]

    seen_routed = seen_folded = 0
    for name, t in layout.items():
        base = name.replace(".exp_avg_sq", "").replace(".exp_avg", "")
        glob = whole[base]
        spec = t["spec"]
        assert t["global_shape"] == glob.shape and len(spec) == glob.ndim
        if is_routed(base):
            seen_routed += 1
            assert spec[0] == "expert" and "tensor" not in spec, name  # whole experts per device
            if mode == "dp_ep":
                assert spec == ("expert", None, None), name
            else:  # fsdp's data split on another dim
                assert "data" in spec[1:], name
            for s in t["shards"]:
                assert s["array"].shape[0] == DSV3["n_routed"] // mesh.expert
        else:  # shared experts, MLA, router follow the dense rules
            if mode == "dp_ep":
                assert spec == (None,) * glob.ndim, name
            elif t["group"] in ("dense_in", "dense_out", "dense_in_whole"):
                # fsdp's split with the expert axis folded into data: 1/(data x expert) on every device
                assert spec in ((None, ("data", "expert")), (("data", "expert"), None)), name
                seen_folded += 1
                for s in t["shards"]:
                    assert s["array"].size * mesh.size == glob.size, name
            else:  # norms and tables stay whole, as under fsdp
                assert spec == (None,) * glob.ndim, name
        cover = np.zeros(glob.shape, dtype=np.int64)
        for s in t["shards"]:
            for dim, axis in enumerate(spec):
                n = glob.shape[dim] // (size(axis) if axis else 1)
                assert s["array"].shape[dim] == n, name
                assert s["offset"][dim] == (mesh.coord(s["device"], axis) * n if axis else 0), name
            block = tuple(slice(o, o + k) for o, k in zip(s["offset"], s["array"].shape))
            cover[block] += 1
            if name == base:
                np.testing.assert_array_equal(s["array"], glob[block])
            else:
                assert not s["array"].any()
        assert (cover == cover.flat[0]).all()
    assert seen_routed == 3 * 3  # w1, w3, w2 and their two moments, in the one MoE layer
    # 26 dense weights: MLA's 5 in each of 3 blocks (2 layers, MTP's), 2 dense MLPs and the shared expert
    # (3 each), the router and MTP's projection; each with its two moments.
    assert seen_folded == (0 if mode == "dp_ep" else 3 * 26)



def batch(seed, skew=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 64, size=(8, 12)).astype(np.int32)
    if skew:
        ids[:] = ids[0, 0]  # one token everywhere: every slot goes to the same top_k experts
    return ids, rng.integers(0, 64, size=(8, 12)).astype(np.int32)


@pytest.mark.parametrize("mode,shape", [("dp_ep", dict(expert=2)), ("dp_ep", dict(data=2, expert=2)),
                                        ("fsdp_ep", dict(data=2, expert=2))])
def test_training_matches_one_process(mode, shape):
    ref = loom.ShardedModel(DSV3, loom.Mesh(), "dp", seed=5, lr=3e-3)
    ep = loom.ShardedModel(DSV3, loom.Mesh(**shape), mode, seed=5, lr=3e-3)
    for s in range(4):
        ids, targets = batch(s, skew=(s == 2))
        a, b = ref.step(ids, targets), ep.step(ids, targets)
        assert abs(a - b) <= 1e-5 * abs(a), (s, a, b)
    # The routing biases moved on the global loads: the same on every device, and as one process has them.
    ref_state, ep_state = ref.state(), ep.state()
    assert set(ref_state) == set(ep_state) == {"layers.1.moe.bias"}
    for name, ref_bias in ref_state.items():
        assert len(ep_state[name]) == ep.mesh.size and np.abs(ref_bias[0]).max() > 0
        for b in ep_state[name]:
            np.testing.assert_array_equal(b, ref_bias[0])
    # The trained experts, reassembled from the devices' shards, match one process's.
    r, e = ref.layout(), ep.layout()
    for name in ("layers.1.moe.experts.w1", "layers.1.moe.experts.w2.exp_avg"):
        whole = np.zeros(e[name]["global_shape"], dtype=np.float32)
        for s in e[name]["shards"]:
            whole[tuple(slice(o, o + k) for o, k in zip(s["offset"], s["array"].shape))] = s["array"]
        np.testing.assert_allclose(whole, r[name]["shards"][0]["array"], rtol=1e-4, atol=1e-6)


def test_max_expert_rows_is_a_clear_error():
    # 48 tokens x top 2 per device: far more than 8 rows reach some device.
    ids, targets = batch(0, skew=True)
    capped = loom.ShardedModel(DSV3, loom.Mesh(expert=2), "dp_ep", seed=5, max_expert_rows=8)
    with pytest.raises(ValueError, match="over the cap of 8 rows"):
        capped.step(ids, targets)
    roomy = loom.ShardedModel(DSV3, loom.Mesh(expert=2), "dp_ep", seed=5, max_expert_rows=10_000)
    assert np.isfinite(roomy.step(ids, targets))
