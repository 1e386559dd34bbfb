"""Argument conversion at the boundary: anything array-like in, C-contiguous arrays of the exact dtype
the extension expects out. Integer ids are range-checked before they are narrowed to int32."""

from __future__ import annotations

import numpy as np

_I32 = np.iinfo(np.int32)


def f32(x, name: str = "x") -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be a numeric array, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.float32, order="C")  # ascontiguousarray makes 0-d arrays 1-d


def i32(x, name: str = "ids") -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "iub":
        raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.size and a.dtype.itemsize >= 4 and a.dtype != np.int32:
        lo, hi = int(a.min()), int(a.max())
        if lo < _I32.min or hi > _I32.max:
            raise ValueError(f"{name} holds values in [{lo}, {hi}], outside int32")
    return np.asarray(a, dtype=np.int32, order="C")


def boolean(x, name: str = "mask") -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "biu":
        raise ValueError(f"{name} must be a boolean array, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.bool_, order="C")


def inplace_f32(x, name: str) -> np.ndarray:
    """An array the extension updates in place: must already be float32, C-contiguous and writeable."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy array updated in place, got {type(x).__name__}")
    if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(
            f"{name} must be a writeable, C-contiguous float32 array to be updated in place "
            f"(got dtype {x.dtype}, contiguous={x.flags.c_contiguous}, writeable={x.flags.writeable})"
        )
    return x
