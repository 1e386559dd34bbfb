"""The device mesh (docs/mesh.md): Mesh, the four modes and their validation, and ShardedModel.

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

Invalid modes and meshes raise ValueError naming the values.
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

from . import _loom
from ._arrays import i32

Mesh = _loom.Mesh
MODES = ("dp", "fsdp", "tp", "fsdp_tp")


def validate_mode(mode: str) -> None:
    """Raises ValueError unless ``mode`` is one of dp, fsdp, tp, fsdp_tp."""
    _loom.validate_parallel_mode(str(mode))


def validate_mesh_for_mode(mesh: Mesh, mode: str) -> None:
    """dp and fsdp need tensor=1, tp needs data=1, fsdp_tp needs both > 1; else ValueError."""
    _loom.validate_mesh_for_mode(mesh, str(mode))


def validate_mesh_for_devices(mesh: Mesh, devices: int) -> None:
    """The mesh must use exactly ``devices`` devices; a larger (or smaller) one raises ValueError."""
    _loom.validate_mesh_for_devices(mesh, int(devices))


def batch_spec(mode: str) -> tuple:
    """The batch's partition spec: ("data", None), or (None, None) for tp."""
    return _loom.batch_spec(str(mode))


class ShardedModel:
    """A model of any family sharded over ``mesh`` in ``mode``, with AdamW whose moments are sharded like
    their parameters. ``config`` is a model section ({"arch": ..., shapes}); missing keys take the
    family's defaults. ``overlap`` overlaps communication with compute (FSDP prefetch, background gradient
    sums; docs/mesh.md); the results are the same bits with it off."""

    def __init__(self, config: Mapping, mesh: Mesh, mode: str, seed: int = 0, lr: float = 1e-3,
                 betas: tuple = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1,
                 grad_clip: float = 1.0, overlap: bool = True):
        self._lr = float(lr)
        self._native = _loom.ShardedModel(json.dumps(dict(config)), mesh, str(mode), int(seed), float(lr),
                                          float(betas[0]), float(betas[1]), float(eps), float(weight_decay),
                                          float(grad_clip), bool(overlap))

    @property
    def mesh(self) -> Mesh:
        return self._native.mesh

    @property
    def mode(self) -> str:
        return self._native.mode

    def step(self, ids, targets, lr: Optional[float] = None) -> float:
        """One optimizer step on the global batch ``ids``/``targets`` (int [B, T]); each data device reads
        its rows. Returns the batch's mean loss."""
        return self._native.step(i32(ids), i32(targets), self._lr if lr is None else float(lr))

    def layout(self) -> dict:
        """name -> {"spec", "global_shape", "group", "shards": [{"device", "offset", "array"}]} for every
        parameter and its moments ("<name>.exp_avg", "<name>.exp_avg_sq"); arrays are copies."""
        return self._native.layout()
