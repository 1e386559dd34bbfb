#!/usr/bin/env python3
"""Makes the safetensors test corpus: valid files written by the reference library (PyPI `safetensors`,
the independent oracle for the format) and hand-built malformed files, one per rule the reader enforces.

    python3 -m pip install safetensors numpy
    python3 tests/io/make_corpus.py

Writes (all deterministic, so rerunning changes nothing):
  corpus/valid/*.safetensors       files that must load
  corpus/malformed/*.safetensors   files that must be refused
  fixtures/reference_values.json   the values and metadata in corpus/valid, as the reference wrote them
  fixtures/malformed_expected.json for each malformed file, text its error message must contain
"""
import json
import os
import struct
import sys

import numpy as np
import safetensors
from safetensors import TensorSpec, serialize
from safetensors.numpy import save as np_save

HERE = os.path.dirname(os.path.abspath(__file__))
VALID = os.path.join(HERE, "corpus", "valid")
MALFORMED = os.path.join(HERE, "corpus", "malformed")
FIXTURES = os.path.join(HERE, "fixtures")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def bf16_bits(values):
    """float32 -> bfloat16 bits, rounding to nearest even (as torch does; no NaNs here)."""
    u = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def reference_serialize(tensors, metadata):
    """tensors: name -> (safetensors dtype name for TensorSpec, shape, numpy array holding the bytes)."""
    specs = {
        name: TensorSpec(dtype=dt, shape=list(shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
        for name, (dt, shape, arr) in tensors.items()
    }
    return bytes(serialize(specs, metadata=metadata))


def expected_entry(dtype, shape, values=None, bits=None):
    e = {"dtype": dtype, "shape": list(shape)}
    if values is not None:
        e["values"] = [v.item() if hasattr(v, "item") else v for v in np.asarray(values).ravel()]
    if bits is not None:
        e["bits"] = [int(b) for b in np.asarray(bits).ravel()]
    return e


# ---- valid files, written by the reference library -------------------------------------------------
def make_valid():
    expected = {}

    # Every dtype loom tensors have, plus a scalar and an empty tensor: loom's writer must reproduce this
    # file byte for byte from the same tensors.
    f32 = (np.arange(6, dtype=np.float32) * np.float32(0.3) - np.float32(0.7)).reshape(2, 3)
    bf16_vals = np.array([1.5, -2.25, 0.0078125, 3.0e38], np.float32)
    bf16 = bf16_bits(bf16_vals)
    i32 = np.array([0, -1, 2147483647, -2147483648, 50256], np.int32)
    u16 = np.array([0, 1, 65535], np.uint16)
    mask = np.array([[1, 0], [1, 1]], np.uint8)
    scale = np.array(0.125, np.float32)
    empty = np.zeros((0, 3), np.float32)
    tensors = {
        "b.weight": ("float32", f32.shape, f32),
        "a.bias": ("bfloat16", (4,), bf16),
        "tokens": ("int32", i32.shape, i32),
        "ids": ("uint16", u16.shape, u16),
        "mask": ("bool", mask.shape, mask),
        "scale": ("float32", (), scale),
        "empty": ("float32", (0, 3), empty),
    }
    write(os.path.join(VALID, "reference_loom_dtypes.safetensors"), reference_serialize(tensors, {"format": "pt"}))
    expected["reference_loom_dtypes.safetensors"] = {
        "metadata": {"format": "pt"},
        "tensors": {
            "b.weight": expected_entry("F32", f32.shape, values=f32),
            # the values the bf16 bits hold (3e38 rounds)
            "a.bias": expected_entry("BF16", (4,), values=(bf16.astype(np.uint32) << 16).view(np.float32)),
            "tokens": expected_entry("I32", i32.shape, values=i32),
            "ids": expected_entry("U16", u16.shape, values=u16),
            "mask": expected_entry("BOOL", mask.shape, values=mask),
            "scale": expected_entry("F32", (), values=scale),
            "empty": expected_entry("F32", (0, 3), values=empty),
        },
    }

    # Through the numpy front end, with dtypes loom only inspects, special floats and richer metadata.
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38], np.float32)
    arrays = {
        "model.embed_tokens.weight": (np.arange(12, dtype=np.float32).reshape(3, 4) / np.float32(7)),
        "special": special,
        "half": np.array([1.0, -0.5, 65504.0], np.float16),
        "step": np.array([123456789012], np.int64),
        "bytes": np.array([0, 7, 255], np.uint8),
        "f64": np.array([[1.0 / 3.0]], np.float64),
        "i8": np.array([-128, 127], np.int8),
    }
    # One key only: the reference writes metadata in its HashMap's order, which changes from run to run.
    metadata = {"note": "caf\u00e9 \u2713"}
    write(os.path.join(VALID, "reference_numpy.safetensors"), np_save(arrays, metadata=metadata))
    ref = {}
    for name, a in arrays.items():
        dt = {"float32": "F32", "float16": "F16", "int64": "I64", "uint8": "U8", "float64": "F64", "int8": "I8"}[a.dtype.name]
        if name == "special":
            ref[name] = expected_entry(dt, a.shape, bits=a.view(np.uint32))
        elif dt == "F32":
            ref[name] = expected_entry(dt, a.shape, values=a)
        else:
            ref[name] = expected_entry(dt, a.shape, bits=a.view(np.uint8))  # raw bytes, read with bytes()
    expected["reference_numpy.safetensors"] = {"metadata": metadata, "tensors": ref}

    write(os.path.join(VALID, "reference_empty.safetensors"), np_save({}))
    expected["reference_empty.safetensors"] = {"metadata": None, "tensors": {}}

    # Valid by the format's rules but made by hand: a header not padded to 8 bytes, so that the F32 data
    # is misaligned in the file (the reader must copy), and tensors listed out of offset order.
    vals = np.array([1.0, 2.0, -3.5], np.float32)
    hdr = (b'{"x":{"dtype":"F32","shape":[3],"data_offsets":[2,14]},"__metadata__":{"format":"pt","empty":"","z":"1"},'
           b'"pad":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}')
    assert (8 + len(hdr) + 2) % 4 != 0, "the F32 tensor must be misaligned"
    write(os.path.join(VALID, "unaligned.safetensors"), struct.pack("<Q", len(hdr)) + hdr + b"\x05\x06" + vals.tobytes())
    expected["unaligned.safetensors"] = {
        "metadata": {"format": "pt", "empty": "", "z": "1"},
        "tensors": {"x": expected_entry("F32", (3,), values=vals), "pad": expected_entry("U8", (2,), bits=[5, 6])},
    }

    # Loadable headers whose tensors loom cannot turn into loom::Tensor (checked by name in the tests).
    def hand(name, header_obj, data):
        hdr = json.dumps(header_obj, separators=(",", ":")).encode()
        hdr += b" " * ((8 - len(hdr) % 8) % 8)
        write(os.path.join(VALID, name), struct.pack("<Q", len(hdr)) + hdr + data)

    hand("bool_not_0_or_1.safetensors", {"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}, b"\x01\x02\x00")
    hand("nine_dims.safetensors", {"t": {"dtype": "BOOL", "shape": [1] * 9, "data_offsets": [0, 1]}}, b"\x01")
    return expected


# ---- malformed files -------------------------------------------------------------------------------
def make_malformed():
    cases = {}  # file name -> text the error must contain

    def raw(name, header_bytes, data=b"", n=None, expect=""):
        n = len(header_bytes) if n is None else n
        write(os.path.join(MALFORMED, name + ".safetensors"), struct.pack("<Q", n) + header_bytes + data)
        cases[name + ".safetensors"] = expect

    def js(name, text, data=b"", expect="", pad=True):
        b = text.encode("utf-8") if isinstance(text, str) else text
        if pad:
            b += b" " * ((8 - len(b) % 8) % 8)
        raw(name, b, data, expect=expect)

    def entry(dtype, shape, begin, end):
        return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}

    def obj(name, header_obj, data=b"", expect=""):
        js(name, json.dumps(header_obj, separators=(",", ":")), data, expect)

    good = np_save({"weight": np.arange(8, dtype=np.float32)})
    write(os.path.join(MALFORMED, "truncated_data.safetensors"), good[:-3])
    cases["truncated_data.safetensors"] = "file is truncated: tensor 'weight' has data_offsets [0, 32]"
    write(os.path.join(MALFORMED, "trailing_bytes.safetensors"), good + b"\x00\x00\x00\x00")
    cases["trailing_bytes.safetensors"] = "4 trailing bytes after the last tensor"
    write(os.path.join(MALFORMED, "too_short.safetensors"), b"\x08\x00\x00")
    cases["too_short.safetensors"] = "too short for the 8-byte header length"
    write(os.path.join(MALFORMED, "truncated_header.safetensors"), good[:40])
    cases["truncated_header.safetensors"] = "runs past the end of the file"

    obj("overlapping_offsets", {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 8, 24)}, bytes(24),
        "tensors 'a' (data_offsets [0, 16]) and 'b' (data_offsets [8, 24]) overlap")
    obj("same_offsets", {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 0, 16)}, bytes(16), "overlap")
    obj("gap", {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 20, 36)}, bytes(36),
        "gap in the data section: data bytes [16, 20) between tensor 'a'")
    obj("gap_at_start", {"a": entry("F32", [4], 4, 20)}, bytes(20), "the first tensor 'a' starts at offset 4")
    obj("reversed_offsets", {"a": entry("U8", [0], 8, 0)}, bytes(8), "data_offsets [8, 0] end before they begin")
    raw("huge_header_length", b"{}", n=(1 << 63) + 5, expect="header length 9223372036854775813 exceeds the limit of 100000000 bytes")
    raw("header_length_past_eof", b"{}      ", n=1000, expect="header length 1000 runs past the end of the file")
    raw("header_length_zero", b"", n=0, expect="header length is 0")
    obj("unknown_dtype", {"a": entry("F128", [2], 0, 32)}, bytes(32), "unknown dtype 'F128'")
    obj("lowercase_dtype", {"a": entry("f32", [2], 0, 8)}, bytes(8), "unknown dtype 'f32'")
    obj("shape_size_mismatch", {"w": entry("F32", [2, 3], 0, 20)}, bytes(20),
        "tensor 'w': shape [2, 3] of F32 needs 24 bytes, but data_offsets [0, 20] span 20 bytes")
    obj("size_overflow_elements", {"w": entry("U8", [1 << 32, 1 << 32, 2], 0, 0)}, b"",
        "shape [4294967296, 4294967296, 2] has more than 2^64 elements")
    obj("size_overflow_bytes", {"w": entry("F32", [1 << 62], 0, 0)}, b"", "the byte size overflows")
    obj("dim_too_large", {"w": entry("U8", [1 << 64], 0, 0)}, b"", "shape entry 0 is")
    obj("negative_dim", {"w": entry("U8", [2, -1], 0, 0)}, b"", "shape entry 1 is -1, but must be a non-negative integer")
    obj("fractional_dim", {"w": entry("U8", [2.5], 0, 2)}, bytes(2), "shape entry 0 is 2.5")
    obj("partial_byte", {"w": entry("F4", [3], 0, 2)}, bytes(2), "3 elements of F4 (4 bits each) do not fill a whole number of bytes")
    # Two identical entries: the reference keeps one and loads the file; loom refuses it.
    js("duplicate_tensor_name",
       '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
       b"\x01", "duplicate tensor name 'a'")
    js("duplicate_name_escaped",
       '{"ab":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"\\u0061b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
       b"\x01\x02", "duplicate tensor name 'ab'")
    js("duplicate_field", '{"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}}', b"\x01",
       "duplicate key 'dtype' in the header entry for 'a'")
    js("duplicate_metadata_key", '{"__metadata__":{"format":"pt","format":"np"}}', b"", "duplicate key 'format' in __metadata__")
    js("non_utf8_header", b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01",
       "header is not valid UTF-8: byte 0xff at header offset 3")
    js("overlong_utf8", b'{"\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01",
       "header is not valid UTF-8: byte 0xc0 at header offset 2")
    js("surrogate_utf8", b'{"\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01",
       "header is not valid UTF-8: byte 0xed at header offset 2")
    js("non_string_metadata", '{"__metadata__":{"format":"pt","step":100}}', b"",
       "__metadata__ value for key 'step' is a number (100), but metadata values must be strings")
    js("metadata_not_object", '{"__metadata__":["pt"]}', b"", "__metadata__ is [\"pt\"], but must be an object")
    js("nul_in_header", b'{}\x00garbage', b"", "header contains a NUL byte at header offset 2")
    js("bom_header", b'\xef\xbb\xbf{}', b"", "header must start with '{', but its first byte is 0xef")
    js("array_header", "[1,2]", b"", "header must start with '{', but its first byte is 0x5b")
    js("not_json", '{"a":', b"", "header is not valid JSON")
    js("trailing_garbage_json", "{} x", b"", "header is not valid JSON")
    js("comment_json", '{/* c */}', b"", "header is not valid JSON")
    # Nesting past io/json.h's limit of 64 (the reference's serde_json stops at 128). ~70,000 levels once
    # overflowed the stack; these stay small enough to seed the fuzzer (its inputs are at most 4096 bytes).
    js("deep_nesting", '{"a":{"dtype":"U8","shape":' + "[" * 200 + "]" * 200 + ',"data_offsets":[0,0]}}', b"",
       "header nests JSON arrays/objects more than 64 levels deep (at byte offset 89)")
    js("deep_metadata", '{"__metadata__":{"x":' + '{"y":' * 200 + '"z"' + "}" * 200 + "}}", b"",
       "header nests JSON arrays/objects more than 64 levels deep")
    obj("entry_not_object", {"a": [1, 2]}, b"", "tensor 'a': header entry is [1,2], but must be an object")
    obj("missing_shape", {"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"\x00", "tensor 'a': missing field 'shape'")
    obj("unknown_field", {"a": dict(entry("U8", [1], 0, 1), extra=1)}, b"\x00", "tensor 'a': unknown field 'extra'")
    obj("dtype_not_string", {"a": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}}, bytes(4), "tensor 'a': dtype is 4")
    obj("offsets_wrong_arity", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"\x00",
        "tensor 'a': data_offsets is [0], but must be [begin, end]")
    return cases


def main():
    for d in (VALID, MALFORMED, FIXTURES):
        os.makedirs(d, exist_ok=True)
    expected = make_valid()
    cases = make_malformed()
    with open(os.path.join(FIXTURES, "reference_values.json"), "w") as f:
        json.dump({"generator": "safetensors " + safetensors.__version__ + ", numpy " + np.__version__,
                   "files": expected}, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(FIXTURES, "malformed_expected.json"), "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    # Every malformed file must also be refused by the reference, except where loom is stricter on
    # purpose (see docs/safetensors.md): check that here, so the corpus stays honest.
    stricter = {"duplicate_tensor_name", "duplicate_name_escaped", "duplicate_field", "duplicate_metadata_key",
                "unknown_field", "bom_header", "array_header", "nul_in_header"}
    for name in sorted(cases):
        with open(os.path.join(MALFORMED, name), "rb") as f:
            data = f.read()
        try:
            safetensors.deserialize(data)
            verdict = "accepted"
        except Exception as e:  # noqa: BLE001  (the binding raises several types)
            verdict = "refused"
        stem = name[: -len(".safetensors")]
        if verdict == "accepted" and stem not in stricter:
            sys.exit(f"{name}: the reference library accepts it, yet it is not marked as loom being stricter")
        print(f"{name:40s} reference: {verdict}")
    for name in sorted(os.listdir(VALID)):
        with open(os.path.join(VALID, name), "rb") as f:
            safetensors.deserialize(f.read())  # raises if the reference refuses a valid file
    print(f"{len(expected)} reference files, {len(cases)} malformed files")


if __name__ == "__main__":
    main()
