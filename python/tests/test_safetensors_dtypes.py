"""save_safetensors / load_safetensors keep every numpy dtype safetensors has (int64 and uint32 arrays
were once narrowed to int32, silently wrapping), and refuse the others."""

import re

import numpy as np
import pytest

import loom


def values_of(dtype):
    """Values that a narrowing or a reinterpretation would change: the type's extremes and specials."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return np.array([True, False, True, True, False], dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array([info.min, info.max, 0, 1, info.max // 3 + 7], dt)
    if dt.kind == "f":
        info = np.finfo(dt)
        return np.array([info.max, info.tiny, -0.0, np.inf, np.nan, -info.max, 1 / 3], dt)
    if dt.kind == "c":
        info = np.finfo(dt)
        return np.array([complex(info.max, -info.tiny), complex(np.nan, np.inf), 1 / 3 + 2j], dt)
    raise AssertionError(dt)


STORED = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64]


def test_safetensors_round_trips_every_numpy_dtype(tmp_path):
    # int64 and uint32 used to be stored as int32, silently wrapping values past 2^31.
    arrays = {}
    for dt in STORED:
        name = np.dtype(dt).name
        arrays[name] = values_of(dt)
        arrays[name + ".2d"] = np.resize(values_of(dt), (2, 3))
        arrays[name + ".scalar"] = values_of(dt)[1].reshape(())
        arrays[name + ".empty"] = np.zeros((0, 4), dt)
    loom.save_safetensors(tmp_path / "all.safetensors", arrays, {"k": "v"})
    back, meta = loom.load_safetensors(tmp_path / "all.safetensors")
    assert meta["k"] == "v"
    assert sorted(back) == sorted(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype, name
        assert back[name].shape == a.shape, name
        np.testing.assert_array_equal(back[name], a, err_msg=name)
        assert back[name].tobytes() == a.tobytes(), name  # bit for bit: -0.0, NaN payloads


def test_safetensors_stores_big_endian_and_strided_arrays_by_value(tmp_path):
    big = np.array([1, -2, 2**40], dtype=">i8")
    strided = np.arange(20, dtype=np.uint32)[::3]
    loom.save_safetensors(tmp_path / "a.safetensors", {"big": big, "strided": strided})
    back, _ = loom.load_safetensors(tmp_path / "a.safetensors")
    assert back["big"].dtype == np.int64 and back["big"].tolist() == [1, -2, 2**40]
    assert back["strided"].dtype == np.uint32 and back["strided"].tolist() == strided.tolist()


def test_safetensors_file_reads_the_same_in_the_reference_library(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {np.dtype(dt).name: values_of(dt) for dt in STORED if dt is not np.complex64}
    loom.save_safetensors(tmp_path / "a.safetensors", arrays)
    theirs = st.load_file(str(tmp_path / "a.safetensors"))
    for name, a in arrays.items():
        assert theirs[name].dtype == a.dtype, name
        assert theirs[name].tobytes() == a.tobytes(), name


@pytest.mark.parametrize("array", [np.zeros(2, np.complex128), np.array(["a", "b"]), np.array([{}, None]),
                                   np.zeros(2, "datetime64[s]"), np.zeros(2, np.longdouble)],
                         ids=["complex128", "str", "object", "datetime64", "longdouble"])
def test_safetensors_refuses_dtypes_it_cannot_store(tmp_path, array):
    if array.dtype == np.float64:  # longdouble is float64 on some platforms: then it is storable
        pytest.skip("longdouble is float64 here")
    with pytest.raises(ValueError, match=f"'x' has dtype {re.escape(str(array.dtype))}.*cannot store"):
        loom.save_safetensors(tmp_path / "a.safetensors", {"x": array})
    assert not (tmp_path / "a.safetensors").exists()
