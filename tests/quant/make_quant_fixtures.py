"""Writes tests/quant/fixtures/quant_cases.bin: small GGUF blocks with the values the `gguf` PyPI
package (gguf-py, llama.cpp's own Python package) decodes them to, and small f32 inputs with the bytes
its quantizers produce (its Q8_0/Q4_0/Q4_1 quantizers are bit-exact ports of ggml's reference ones).

Run from the repository root with a venv that has gguf and numpy (not needed by the tests):
    python3 -m venv /tmp/qvenv && /tmp/qvenv/bin/pip install gguf numpy
    /tmp/qvenv/bin/python tests/quant/make_quant_fixtures.py

File layout (little-endian): b"LQF1", u32 case count, then per case:
    u32 name length, name (utf-8), u32 ggml type id, u32 kind (0 = dequantize, 1 = quantize),
    u64 n (elements), u64 byte count, the bytes, n f32 values.
  kind 0: the bytes are the input, the floats what gguf.quants.dequantize returns.
  kind 1: the floats are the input, the bytes what gguf.quants.quantize returns.
"""
import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = Path(__file__).resolve().parent / "fixtures" / "quant_cases.bin"
rng = np.random.default_rng(14)
cases = []


def f16_bytes(values):
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint8)


def add(name, qtype, kind, data_bytes, floats):
    data_bytes = np.ascontiguousarray(data_bytes, dtype=np.uint8).reshape(-1)
    floats = np.ascontiguousarray(floats, dtype=np.float32).reshape(-1)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    assert data_bytes.size == floats.size // block_elems * block_bytes, name
    cases.append((name, int(qtype), kind, floats.size, data_bytes.tobytes(), floats.tobytes()))


def random_blocks(qtype, n_blocks, scale_offsets):
    """Random block bytes whose f16 scale fields (at the given byte offsets) hold sane finite values."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in scale_offsets:
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float32)
        blocks[:, off:off + 2] = f16_bytes(scales).reshape(n_blocks, 2)
    return blocks


def dequantize_case(name, qtype, blocks):
    add(name, qtype, 0, blocks, quants.dequantize(blocks.reshape(-1), qtype))


# ---- dequantization: random bit patterns through every decoder --------------------------------------
f32 = rng.standard_normal(64).astype(np.float32)
f32[:6] = [0.0, -0.0, np.inf, -np.inf, 1e-40, -3.4e38]
dequantize_case("dequantize F32", T.F32, f32.view(np.uint8))

h = rng.integers(0, 1 << 16, size=256, dtype=np.uint16)
h[:8] = [0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0x7c00, 0xfc00]  # 0, -0, subnormals, min/max normal, inf
h[((h & 0x7c00) == 0x7c00) & ((h & 0x03ff) != 0)] = 0x7e00  # one quiet NaN pattern: decoders may quiet others
dequantize_case("dequantize F16", T.F16, h.view(np.uint8))

b = rng.integers(0, 1 << 16, size=256, dtype=np.uint16)
b[:4] = [0x0000, 0x8000, 0x7f80, 0x0001]
b[((b & 0x7f80) == 0x7f80) & ((b & 0x007f) != 0)] = 0x7fc0
dequantize_case("dequantize BF16", T.BF16, b.view(np.uint8))

dequantize_case("dequantize Q4_0", T.Q4_0, random_blocks(T.Q4_0, 6, [0]))
dequantize_case("dequantize Q4_1", T.Q4_1, random_blocks(T.Q4_1, 6, [0, 2]))
dequantize_case("dequantize Q5_0", T.Q5_0, random_blocks(T.Q5_0, 6, [0]))
dequantize_case("dequantize Q5_1", T.Q5_1, random_blocks(T.Q5_1, 6, [0, 2]))
dequantize_case("dequantize Q8_0", T.Q8_0, random_blocks(T.Q8_0, 6, [0]))
dequantize_case("dequantize Q4_K", T.Q4_K, random_blocks(T.Q4_K, 3, [0, 2]))
dequantize_case("dequantize Q6_K", T.Q6_K, random_blocks(T.Q6_K, 3, [208]))

# ---- quantization: the gguf package's (= ggml's reference) bytes for chosen inputs ------------------


def quantize_case(name, qtype, x):
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    add(name, qtype, 1, quants.quantize(x, qtype).view(np.uint8), x)


def block_inputs():
    """Blocks of 32 that exercise the rounding: random scales, zeros, constants, exact ties, extremes."""
    blocks = [rng.standard_normal(32) * s for s in (1.0, 0.02, 300.0)]
    blocks.append(np.zeros(32))
    blocks.append(np.full(32, -0.75))
    ties = np.arange(-16, 16) + 0.5  # with amax 127 (Q8_0: d = 1) every value is a tie
    ties[0] = 127.0
    blocks.append(ties)
    blocks.append(np.linspace(0.0, 15.0, 32))  # Q4_1: d = 1, m = 0, values between grid points
    blocks.append(np.where(np.arange(32) % 2 == 0, 1e-6, -3e-6))  # scales below f16's normal range
    spiky = rng.standard_normal(32) * 0.01
    spiky[7] = -5.0  # one outlier sets the scale (Q4_0 keeps its sign)
    blocks.append(spiky)
    return np.concatenate(blocks).astype(np.float32)


x = block_inputs()
quantize_case("quantize F32", T.F32, x[:64])
quantize_case("quantize Q8_0", T.Q8_0, x)
quantize_case("quantize Q4_0", T.Q4_0, x)
quantize_case("quantize Q4_1", T.Q4_1, x)

f16_in = np.concatenate([
    rng.standard_normal(32) * 10.0,
    [65504.0, 65519.0, 65520.0, 1e6, -np.inf, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e-9, -0.0,
     1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2.0 ** -14 - 2.0 ** -26, 6.1e-5, 0.1, -1.0 / 3.0],
]).astype(np.float32)
quantize_case("quantize F16", T.F16, f16_in)

bf16_in = np.concatenate([
    rng.standard_normal(32) * 1e3,
    np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.4e38, -1e-40, 0.0, np.inf], dtype=np.float32),
]).astype(np.float32)
bf16_in = np.concatenate([bf16_in, np.array([0x7fc00001, 0xffa00000], dtype=np.uint32).view(np.float32)])
quantize_case("quantize BF16", T.BF16, bf16_in)

with open(OUT, "wb") as f:
    f.write(b"LQF1")
    f.write(struct.pack("<I", len(cases)))
    for name, qtype, kind, n, data, floats in cases:
        name_b = name.encode()
        f.write(struct.pack("<I", len(name_b)) + name_b)
        f.write(struct.pack("<IIQQ", qtype, kind, n, len(data)))
        f.write(data)
        f.write(floats)
print(f"wrote {len(cases)} cases, {OUT.stat().st_size} bytes, to {OUT}")
