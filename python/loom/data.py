"""Language-model batches from a token array (CS336's get_batch)."""

from __future__ import annotations

import re
from typing import Annotated

import numpy as np

from . import _loom
from numpy.typing import ArrayLike

from ._arrays import SEED, SIZE, ArrayOf, Below, Text, checked, fits_budget


@checked
def check_device(device: str, what: Annotated[str, Text()] = "get_batch") -> str:
    """"cpu" passes. A CUDA name ("cuda", "cuda:1") raises RuntimeError saying why it cannot be used
    here: this build has no CUDA backend, there is no CUDA driver or GPU, or (with a GPU) loom's models do
    not run on CUDA yet (docs/cuda.md). "mps" raises RuntimeError (no such backend); anything else is a
    ValueError."""
    d = str(device)
    if d == "cpu":
        return d
    if re.fullmatch(r"cuda(:\d+)?", d):
        reason = _loom.model_device_error(d, what)
        if reason:
            raise RuntimeError(reason)
        return d
    if re.fullmatch(r"mps(:\d+)?", d):
        raise RuntimeError(f"device '{d}' is not available: loom has no Apple GPU backend")
    raise ValueError(f"unknown device '{d}' (expected 'cpu' or 'cuda[:N]')")


@checked
def get_batch(dataset: Annotated[ArrayLike, ArrayOf("int64")], batch_size: Annotated[int, SIZE],
              context_length: Annotated[int, SIZE, Below("dataset.len")],
              device: str = "cpu", *, seed: Annotated[int, SEED] | None = None,
              index: Annotated[int, SEED] = 0) -> tuple[np.ndarray, np.ndarray]:
    """batch_size windows of context_length tokens, each starting uniformly in [0, n - context_length - 1]:
    inputs x[s : s+T] and targets x[s+1 : s+T+1], as int64 arrays [B, T].

    dataset: a 1-D integer array (np.memmap works; only the windows are read). With `seed`, batch
    `index` is drawn from loom's counter-based RNG, the same as the C++ loader's; without, the seed comes
    from numpy's global RNG (so np.random.seed makes runs repeatable).
    """
    check_device(device)
    data = np.asarray(dataset) if not isinstance(dataset, np.ndarray) else dataset
    if data.ndim != 1 or data.dtype.kind not in "iu":
        raise ValueError(f"get_batch: dataset must be a 1-D integer array, got {data.dtype} {data.shape}")
    if data.shape[0] <= context_length:
        raise ValueError(f"get_batch: dataset has {data.shape[0]} tokens (shape {data.shape}), too few for a window "
                         f"of context_length={context_length} plus its target")
    # The starts, the index grid and the two int64 batches.
    fits_budget(8.0 * batch_size * (3 * context_length + 1),
                f"get_batch: batch_size={batch_size} windows of context_length={context_length}")
    if seed is None:
        seed = int(np.random.randint(0, 2**62))
    starts = np.asarray(_loom.random_starts(int(seed), int(index), int(data.shape[0]), int(batch_size),
                                            int(context_length)), dtype=np.int64)
    idx = starts[:, None] + np.arange(context_length, dtype=np.int64)[None, :]
    return data[idx].astype(np.int64), data[idx + 1].astype(np.int64)
