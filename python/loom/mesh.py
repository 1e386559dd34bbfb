"""The device mesh (docs/mesh.md): Mesh, the six modes and their validation, and ShardedModel.

ShardedModel simulates N devices in one process (ranks as threads, loom's in-process communicator), as
JAX's ``--xla_force_host_platform_device_count=8`` does, so a test can check physically which device
holds which slice of every parameter and optimizer moment::

    mesh = loom.Mesh(data=2, tensor=2)
    model = loom.ShardedModel({"arch": "llama", "vocab_size": 64, ...}, mesh, "fsdp_tp", seed=0)
    for name, t in model.layout().items():
        t["spec"], t["global_shape"]            # ("tensor", "data"), (64, 32)
        for s in t["shards"]:
            s["device"], s["offset"], s["array"]  # 3, (16, 16), float32 array of shape (16, 16)
    loss = model.step(ids, targets)            # one AdamW step on the global batch

Expert parallelism (DeepSeek-V3's routed experts split over the ``expert`` axis; tokens travel by
all-to-all)::

    mesh = loom.Mesh(data=2, expert=2)
    model = loom.ShardedModel(dsv3_config, mesh, "dp_ep", seed=0)
    model.layout()["layers.1.moe.w1"]["spec"]  # ("expert", None, None): each device holds n_routed/2 experts

Under fsdp_ep the dense weights are split over data and expert folded into one axis, as JAX writes it:
``layout()["layers.0.attn.wq_b.weight"]["spec"] == (None, ("data", "expert"))``; ``mesh.coord(device,
("data", "expert"))`` is a device's block index on such a dimension.

Invalid modes and meshes raise ValueError naming the values.
"""

from __future__ import annotations

import json
from typing import Annotated, Mapping, Sequence

from . import _loom
from numpy.typing import ArrayLike

from ._arrays import (COUNT, NONNEGATIVE, POSITIVE, SEED, SIZE, ArrayOf, Below, Divides, Equal, MultipleOf, Range,
                      Relation, checked, i32)

MESH_AXIS = Range(1, 1 << 20)  # a million devices on one axis is past any machine; the product stays in int64
DEVICE = Range(0, 2**63 - 1)


class Mesh(_loom.Mesh):
    """data x tensor x expert devices (docs/mesh.md). Sizes are checked here (positive, at most 2^20 per
    axis), devices by coords/coord (in [0, size))."""

    @checked
    def __init__(self, data: Annotated[int, MESH_AXIS] = 1, tensor: Annotated[int, MESH_AXIS] = 1,
                 expert: Annotated[int, MESH_AXIS] = 1):
        super().__init__(data, tensor, expert)

    @classmethod
    @checked
    def parse(cls, text: str) -> "Mesh":
        """A mesh from "data=4,tensor=2" (the CLI's --mesh)."""
        m = _loom.Mesh.parse(text)
        return cls(m.data, m.tensor, m.expert)

    @checked
    def coords(self, device: Annotated[int, DEVICE, Below("self.size")]) -> tuple:
        """(data, tensor) coordinates of `device`, and expert's when the mesh has that axis."""
        return super().coords(device)

    @checked
    def coord(self, device: Annotated[int, DEVICE, Below("self.size")], axes: str | Sequence[str]) -> int:
        """`device`'s coordinate on one axis ("data"), or its block index on folded axes (("data", "expert"))."""
        return super().coord(device, axes if isinstance(axes, str) else list(axes))


MODES = ("dp", "fsdp", "tp", "fsdp_tp", "dp_ep", "fsdp_ep")


class FitsMode(Relation):
    """A mesh the parallel mode `target` can run on (dist::validate_mesh_for_mode): dp and fsdp need
    tensor=1, tp data=1, fsdp_tp data and tensor > 1; dp_ep and fsdp_ep tensor=1 and expert > 1; every
    other mode expert=1."""
    words = "must suit the mode"

    def holds(self, mesh, mode):
        d, t, e = mesh.data, mesh.tensor, mesh.expert
        return {"dp": t == 1 and e == 1, "fsdp": t == 1 and e == 1, "tp": d == 1 and e == 1,
                "fsdp_tp": d > 1 and t > 1 and e == 1, "dp_ep": t == 1 and e > 1,
                "fsdp_ep": t == 1 and e > 1}.get(mode, True)


@checked
def validate_mode(mode: str) -> None:
    """Raises ValueError unless ``mode`` is one of dp, fsdp, tp, fsdp_tp, dp_ep, fsdp_ep."""
    _loom.validate_parallel_mode(str(mode))


@checked
def validate_mesh_for_mode(mesh: Annotated[_loom.Mesh, FitsMode("mode")], mode: str) -> None:
    """dp and fsdp need tensor=1, tp needs data=1, fsdp_tp needs both > 1, dp_ep and fsdp_ep need tensor=1
    and expert > 1, and every other mode expert=1; else ValueError."""
    _loom.validate_mesh_for_mode(mesh, str(mode))


@checked
def validate_experts_for_mesh(n_routed: Annotated[int, SIZE, MultipleOf("mesh.expert")], mesh: _loom.Mesh, mode: str) -> None:
    """Under dp_ep and fsdp_ep each expert device holds whole experts: ``n_routed`` must divide by
    ``mesh.expert``; else ValueError naming model.n_routed."""
    _loom.validate_experts_for_mesh(int(n_routed), mesh, str(mode))


@checked
def validate_mesh_for_devices(mesh: _loom.Mesh, devices: Annotated[int, SIZE, Equal("mesh.size")]) -> None:
    """The mesh must use exactly ``devices`` devices; a larger (or smaller) one raises ValueError."""
    try:
        _loom.validate_mesh_for_devices(mesh, int(devices))
    except ValueError as e:
        raise ValueError(f"validate_mesh_for_devices: devices={devices}: {e}") from None


@checked
def batch_spec(mode: str) -> tuple:
    """The batch's partition spec: ("data", None), or (None, None) for tp. Under dp_ep and fsdp_ep the rows
    split over data x expert: (("data", "expert"), None), device d * expert + e taking slice d * expert + e."""
    return _loom.batch_spec(str(mode))


class ShardedModel:
    """A model of any family sharded over ``mesh`` in ``mode``, with AdamW whose moments are sharded like
    their parameters. ``config`` is a model section ({"arch": ..., shapes}); missing keys take the
    family's defaults. ``overlap`` overlaps communication with compute (FSDP prefetch, background gradient
    sums; docs/mesh.md); the results are the same bits with it off. ``max_expert_rows`` (dp_ep, fsdp_ep)
    caps the token rows one device may receive for its experts in one MoE layer: a step whose routing
    sends more raises ValueError naming both counts (0: no cap)."""

    @checked
    def __init__(self, config: Mapping,
                 mesh: Annotated[_loom.Mesh, FitsMode("mode"), Divides("config.num_heads", of="tensor")], mode: str,
                 seed: Annotated[int, SEED] = 0,
                 lr: Annotated[float, NONNEGATIVE] = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 eps: Annotated[float, POSITIVE] = 1e-8, weight_decay: Annotated[float, NONNEGATIVE] = 0.1,
                 grad_clip: Annotated[float, NONNEGATIVE] = 1.0, overlap: bool = True,
                 max_expert_rows: Annotated[int, COUNT] = 0):
        self._lr = float(lr)
        self._native = _loom.ShardedModel(json.dumps(dict(config)), mesh, str(mode), int(seed), float(lr),
                                          float(betas[0]), float(betas[1]), float(eps), float(weight_decay),
                                          float(grad_clip), bool(overlap), int(max_expert_rows))

    @property
    def mesh(self) -> _loom.Mesh:
        return self._native.mesh

    @property
    def config(self) -> dict:
        """The complete model section, "arch" included."""
        return json.loads(self._native.config_json)

    @property
    def mode(self) -> str:
        return self._native.mode

    @checked
    def step(self, ids: Annotated[ArrayLike, ArrayOf("int", "B, T", multiple_of={"B": "self.mesh.data*self.mesh.expert"},
                                                   at_most={"T": "self.config.context_length"},
                                                   below="self.config.vocab_size")],
             targets: Annotated[ArrayLike, ArrayOf("int", "B, T", below="self.config.vocab_size")],
             lr: Annotated[float, NONNEGATIVE] | None = None) -> float:
        """One training step on the global batch ``ids``/``targets`` (int [B, T]), as ``loom train`` takes
        it: each data (x expert) device reads its rows; the forward is a training one (dropout,
        DeepSeek-V3's MTP and balance losses) and DeepSeek-V3's routing biases move afterwards on the
        global expert loads. Returns the batch's mean loss."""
        x, y = i32(ids, "ids"), i32(targets, "targets")
        if x.ndim != 2 or x.shape != y.shape or x.size == 0:
            raise ValueError(f"ShardedModel.step: ids {x.shape} and targets {y.shape} must be [B, T] of one "
                             "shape, with B and T at least 1")
        # Checked here, before any rank starts: a rank that fails mid-step abandons the others' collectives,
        # and the model is then broken for every later step.
        c, mesh = self.config, self.mesh
        rows = mesh.data * mesh.expert
        if x.shape[0] % rows:
            raise ValueError(f"ShardedModel.step: ids has {x.shape[0]} rows (shape {x.shape}), not a multiple of the "
                             f"{rows} data devices (mesh.data={mesh.data} x mesh.expert={mesh.expert})")
        if x.shape[1] > c["context_length"]:
            raise ValueError(f"ShardedModel.step: ids has T={x.shape[1]} (shape {x.shape}), more than the model's "
                             f"context_length={c['context_length']}")
        for name, a in (("ids", x), ("targets", y)):
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= c["vocab_size"]:
                raise ValueError(f"ShardedModel.step: {name} holds {hi if hi >= c['vocab_size'] else lo}, outside the "
                                 f"model's vocabulary [0, vocab_size={c['vocab_size']})")
        return self._native.step(x, y, self._lr if lr is None else float(lr))

    def layout(self) -> dict:
        """name -> {"spec", "global_shape", "group", "shards": [{"device", "offset", "array"}]} for every
        parameter and its moments ("<name>.exp_avg", "<name>.exp_avg_sq"); arrays are copies."""
        return self._native.layout()

    def state(self) -> dict:
        """Model state that is not a parameter (DeepSeek-V3's routing biases ``layers.N.moe.bias``):
        name -> list of one array copy per device (replicated: every device's must agree)."""
        return self._native.state()
