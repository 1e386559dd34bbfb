// Reference (scalar) dequantizers and quantizers of the GGUF/ggml block formats. Written for clarity:
// one function per format, the block layout spelled out as a struct, and the quantizers' rounding made
// explicit because export must produce the same bytes as ggml's reference quantizers.
//
// Byte order: GGUF is little-endian and so is every CPU loom runs on (x86-64, aarch64); the structs
// below are read by memcpy, so unaligned blocks (a 20-byte Q4_1 block starts at any byte) are fine.
#include "quant/quant.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace loom::quant {

static_assert(std::endian::native == std::endian::little, "GGUF blocks are read as little-endian structs");

// ---- half precision ------------------------------------------------------------------------------

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / NaN: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // +-0
    bits = sign;
  } else {  // subnormal: mant * 2^-24, renormalised
    int e = 113;  // exponent of 2^-14 in f32 bias, minus the shifts below
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest even, overflow to inf, NaN stays a quiet NaN: what F16C's vcvtps2ph and numpy's
// astype(float16) do, so F16 export matches ggml's and the gguf package's bytes.
uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {  // below 2^-14: an f16 subnormal (or 0), value = m * 2^-24
    // Adding 0.5 (2^-1) aligns the f32 mantissa so that its low bits are the f16 subnormal's, and the
    // FPU's round-to-nearest-even does the rounding.
    const float shifted = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent, then round the 13 dropped mantissa bits to nearest even (a carry into
  // the exponent is the right result, up to inf which was handled above).
  uint32_t r = ax - ((127u - 15u) << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// ---- the type table --------------------------------------------------------------------------------

namespace {

constexpr int64_t kQK = 32;    // elements of a Q4_0 .. Q8_0 block
constexpr int64_t kQK_K = 256;  // elements of a K-quant super-block

// The block layouts (GGUF specification / ggml-common.h). f16 fields are stored as raw bits.
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };                     // x = (q - 8) * d
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };                  // x = q * d + m
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };      // x = (q - 16) * d
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };   // x = q * d + m
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };                          // x = q * d
// Q4_K: 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed into `scales`;
// x = d * sc[j] * q - dmin * m[j].
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[kQK_K / 2]; };
// Q6_K: 16 sub-blocks of 16, each with an int8 scale; q is 6 bits (4 in ql, 2 in qh);
// x = d * sc[j] * (q - 32).
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ6_K) == 210, "GGUF block sizes");

template <typename Block>
Block load_block(const void* data, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(data) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

template <typename Block>
void store_block(void* out, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(out) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

// Names of the ggml types loom knows about but does not decode, so a file using one is refused by name.
const char* unsupported_type_name(uint32_t id) {
  switch (id) {
    case 4: return "Q4_2 (removed from ggml)";
    case 5: return "Q4_3 (removed from ggml)";
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 13: return "Q5_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return nullptr;
  }
}

}  // namespace

QuantType quant_type_from_id(uint32_t id) {
  switch (id) {
    case 0: case 1: case 2: case 3: case 6: case 7: case 8: case 12: case 14: case 30:
      return static_cast<QuantType>(id);
    default: break;
  }
  if (const char* name = unsupported_type_name(id)) {
    LOOM_FAIL("tensor type ", name, " (ggml type id ", id, ") is not supported; loom decodes F32, F16, BF16, "
              "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K");
  }
  LOOM_FAIL("unknown ggml tensor type id ", id, "; loom decodes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
            "Q4_K and Q6_K");
}

const char* quant_type_name(QuantType type) {
  switch (type) {
    case QuantType::F32: return "F32";
    case QuantType::F16: return "F16";
    case QuantType::Q4_0: return "Q4_0";
    case QuantType::Q4_1: return "Q4_1";
    case QuantType::Q5_0: return "Q5_0";
    case QuantType::Q5_1: return "Q5_1";
    case QuantType::Q8_0: return "Q8_0";
    case QuantType::Q4_K: return "Q4_K";
    case QuantType::Q6_K: return "Q6_K";
    case QuantType::BF16: return "BF16";
  }
  LOOM_ASSERT(false, "unknown QuantType ", static_cast<uint32_t>(type));
  return "?";
}

int64_t block_elements(QuantType type) {
  switch (type) {
    case QuantType::F32: case QuantType::F16: case QuantType::BF16: return 1;
    case QuantType::Q4_0: case QuantType::Q4_1: case QuantType::Q5_0: case QuantType::Q5_1: case QuantType::Q8_0:
      return kQK;
    case QuantType::Q4_K: case QuantType::Q6_K: return kQK_K;
  }
  LOOM_ASSERT(false, "unknown QuantType ", static_cast<uint32_t>(type));
  return 0;
}

int64_t block_bytes(QuantType type) {
  switch (type) {
    case QuantType::F32: return 4;
    case QuantType::F16: case QuantType::BF16: return 2;
    case QuantType::Q4_0: return sizeof(BlockQ4_0);
    case QuantType::Q4_1: return sizeof(BlockQ4_1);
    case QuantType::Q5_0: return sizeof(BlockQ5_0);
    case QuantType::Q5_1: return sizeof(BlockQ5_1);
    case QuantType::Q8_0: return sizeof(BlockQ8_0);
    case QuantType::Q4_K: return sizeof(BlockQ4_K);
    case QuantType::Q6_K: return sizeof(BlockQ6_K);
  }
  LOOM_ASSERT(false, "unknown QuantType ", static_cast<uint32_t>(type));
  return 0;
}

int64_t row_bytes(QuantType type, int64_t n) {
  const int64_t be = block_elements(type);
  LOOM_CHECK(n >= 0 && n % be == 0, quant_type_name(type), ": ", n, " elements is not a multiple of the block size ",
             be, " (", quant_type_name(type), " stores blocks of ", be, " elements in ", block_bytes(type),
             " bytes)");
  return n / be * block_bytes(type);
}

// ---- dequantizers ----------------------------------------------------------------------------------

namespace {

// Low nibbles hold elements 0..15 of a block, high nibbles elements 16..31.
void dequantize_q4_0(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const BlockQ4_0 b = load_block<BlockQ4_0>(data, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const BlockQ4_1 b = load_block<BlockQ4_1>(data, i);
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The fifth bit of element j is bit j of the 32-bit qh.
void dequantize_q5_0(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const BlockQ5_0 b = load_block<BlockQ5_0>(data, i);
    const float d = f16_to_f32(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_q5_1(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const BlockQ5_1 b = load_block<BlockQ5_1>(data, i);
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequantize_q8_0(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const BlockQ8_0 b = load_block<BlockQ8_0>(data, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

}  // namespace

// Q4_K's 12 scale bytes hold 8 (scale, min) pairs of 6 bits: pairs 0..3 in the low 6 bits of bytes 0..3
// (scales) and 4..7 (mins); pairs 4..7 in the nibbles of bytes 8..11, their top two bits in the top two
// bits of bytes 0..7.
void q4_k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

namespace {

// Each 64 elements share 32 bytes of qs: sub-block 2k in the low nibbles, 2k+1 in the high ones.
void dequantize_q4_k(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_K b = load_block<BlockQ4_K>(data, i);
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc0, m0, sc1, m1;
      q4_k_scale_min(b.scales, j, &sc0, &m0);
      q4_k_scale_min(b.scales, j + 1, &sc1, &m1);
      const float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(q[l] & 0x0f) - min0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] >> 4) - min1;
    }
  }
}

// Each half (128 elements) uses 64 bytes of ql, 32 of qh and 8 scales: element l + 32*k of the half
// takes the low (k = 0, 1) or high (k = 2, 3) nibble of ql[l + 32*(k%2)] and bits 2k..2k+1 of qh[l].
void dequantize_q6_k(const void* data, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K b = load_block<BlockQ6_K>(data, i);
    const float d = f16_to_f32(b.d);
    for (int half = 0; half < 2; ++half, y += 128) {
      const uint8_t* ql = b.ql + 64 * half;
      const uint8_t* qh = b.qh + 32 * half;
      const int8_t* sc = b.scales + 8 * half;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

void dequantize(QuantType type, const void* data, int64_t n, float* out) {
  const int64_t nb = row_bytes(type, n) / block_bytes(type);  // checks n against the block size
  const auto* bytes = static_cast<const uint8_t*>(data);
  switch (type) {
    case QuantType::F32:
      std::memcpy(out, data, static_cast<size_t>(n) * 4);
      return;
    case QuantType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case QuantType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        bf16 h;
        std::memcpy(&h.bits, bytes + 2 * i, 2);
        out[i] = h.to_float();
      }
      return;
    case QuantType::Q4_0: return dequantize_q4_0(data, nb, out);
    case QuantType::Q4_1: return dequantize_q4_1(data, nb, out);
    case QuantType::Q5_0: return dequantize_q5_0(data, nb, out);
    case QuantType::Q5_1: return dequantize_q5_1(data, nb, out);
    case QuantType::Q8_0: return dequantize_q8_0(data, nb, out);
    case QuantType::Q4_K: return dequantize_q4_k(data, nb, out);
    case QuantType::Q6_K: return dequantize_q6_k(data, nb, out);
  }
  LOOM_ASSERT(false, "unknown QuantType ", static_cast<uint32_t>(type));
}

// ---- quantizers ------------------------------------------------------------------------------------
//
// These reproduce ggml's reference quantizers (quantize_row_*_ref) bit for bit, including their
// rounding, which differs per format:
//   Q8_0: d = amax / 127, q = roundf(x * (1/d)): nearest, ties away from zero.
//   Q4_0: d = v / -8 where v is the element of largest magnitude (sign kept, first one on ties), so v
//         itself maps to q = 0 and the grid is [-8, 7] * d; q = min(15, trunc(x * (1/d) + 8.5)).
//   Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) * (1/d) + 0.5)).
// The scale is computed in f32 and stored as f16, and q is computed from the f32 scale (not the stored
// f16 one), exactly as ggml does. An all-zero block gets d = 0 and q = 0 (1/d is taken as 0).

namespace {

float inverse_or_zero(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

void quantize_q8_0(const float* x, int64_t nb, void* out) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = inverse_or_zero(d);
    BlockQ8_0 b;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    store_block(out, i, b);
  }
}

void quantize_q4_0(const float* x, int64_t nb, void* out) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    }
    const float d = vmax / -8.0f, id = inverse_or_zero(d);
    BlockQ4_0 b;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
      b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    store_block(out, i, b);
  }
}

void quantize_q4_1(const float* x, int64_t nb, void* out) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    const float d = (hi - lo) / 15.0f, id = inverse_or_zero(d);
    BlockQ4_1 b;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - lo) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + kQK / 2] - lo) * id + 0.5f)));
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(out, i, b);
  }
}

}  // namespace

void quantize(QuantType type, const float* x, int64_t n, void* out) {
  const int64_t nb = row_bytes(type, n) / block_bytes(type);
  auto* bytes = static_cast<uint8_t*>(out);
  switch (type) {
    case QuantType::F32:
      std::memcpy(out, x, static_cast<size_t>(n) * 4);
      return;
    case QuantType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case QuantType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bf16::from_float(x[i]).bits;
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case QuantType::Q8_0: return quantize_q8_0(x, nb, out);
    case QuantType::Q4_0: return quantize_q4_0(x, nb, out);
    case QuantType::Q4_1: return quantize_q4_1(x, nb, out);
    case QuantType::Q5_0: case QuantType::Q5_1: case QuantType::Q4_K: case QuantType::Q6_K: break;
  }
  LOOM_FAIL("quantize: loom does not write ", quant_type_name(type),
            " (it writes F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
}

}  // namespace loom::quant
