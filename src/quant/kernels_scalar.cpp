// Portable scalar kernels of quantized_matmul: the same integer block dot products as the SIMD paths,
// one element at a time. The fallback on CPUs without AVX2 and the readable statement of what the
// SIMD kernels compute (block layouts: quant.cpp).
#include <cmath>
#include <cstring>

#include "quant/kernels.h"

namespace loom::quant::detail {
namespace {

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// d = max|x| / 127, q = round-half-even(x / d); a block holding inf or NaN gets d = NaN (so the outputs
// it touches are NaN, as in the f32 path) and q = 0.
void quantize_row(const float* x, int64_t K, ActBlock* out) {
  for (int64_t b = 0; b < K / 32; ++b, x += 32) {
    ActBlock& blk = out[b];
    float amax = 0.0f, nonfinite = 0.0f;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
      nonfinite += x[j] - x[j];  // NaN iff some x[j] is inf or NaN
    }
    blk.q8_bias = 0;
    if (std::isnan(nonfinite)) {
      blk.d = blk.s = NAN;
      std::memset(blk.q, 0, 32);
      blk.sum16[0] = blk.sum16[1] = 0;
      continue;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(x[j] * id));  // default mode: nearest even
      blk.q[j] = static_cast<int8_t>(q);
      sum[j / 16] += q;
    }
    blk.d = d;
    blk.s = d * static_cast<float>(sum[0] + sum[1]);
    blk.sum16[0] = static_cast<int16_t>(sum[0]);
    blk.sum16[1] = static_cast<int16_t>(sum[1]);
    blk.q8_bias = 128 * (sum[0] + sum[1]);
  }
}

// Int8x2's level 1 (qmatmul.h): the residual x - d q formed by one fused multiply-add, scaled by
// 256 / d (level 0's 1/d, exactly times 256), clamped to [-127, 127] and rounded half to even. The
// SIMD paths do the same operations (vfmadd, vmulps, vmaxps / vminps, vcvtps2dq), so the same bytes.
void quantize_residual(const float* x, int64_t K, const ActBlock* level0, ActBlock* out) {
  for (int64_t b = 0; b < K / 32; ++b, x += 32) {
    const ActBlock& l0 = level0[b];
    ActBlock& blk = out[b];
    blk.q8_bias = 0;
    if (std::isnan(l0.d)) {  // a block holding inf or NaN: NaN on both levels
      blk.d = blk.s = NAN;
      std::memset(blk.q, 0, 32);
      blk.sum16[0] = blk.sum16[1] = 0;
      continue;
    }
    const float d = l0.d, scale = (l0.d != 0.0f ? 1.0f / d : 0.0f) * 256.0f;
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      float t = std::fma(-d, static_cast<float>(l0.q[j]), x[j]) * scale;
      t = t > -127.0f ? t : -127.0f;  // vmaxps(t, -127), then vminps(t, 127): NaN would become -127 on both
      t = t < 127.0f ? t : 127.0f;
      const int q = static_cast<int>(std::nearbyint(t));
      blk.q[j] = static_cast<int8_t>(q);
      sum[j / 16] += q;
    }
    blk.d = d * (1.0f / 256.0f);
    blk.s = blk.d * static_cast<float>(256 * (l0.sum16[0] + l0.sum16[1]) + sum[0] + sum[1]);
    blk.sum16[0] = static_cast<int16_t>(sum[0]);
    blk.sum16[1] = static_cast<int16_t>(sum[1]);
    blk.q8_bias = 256 * l0.q8_bias + 128 * (sum[0] + sum[1]);
  }
}

// Each format: the dot product of weight row `w` with activation row `a` over nb blocks of 32. With
// L = 2 (Int8x2), a is a token's level 0 and a + nb its level 1: each block's integer dot is
// 256 dot(w, q) + dot(w, q') (exact in int32), scaled by level 1's d and s (qmatmul.h).

// The activation block whose d and s scale block b's dot, and that dot from the levels' own.
template <int L>
const ActBlock& scale_block(const ActBlock* a, int64_t nb, int64_t b) {
  return a[(L - 1) * nb + b];
}
template <int L, class Dot>
int32_t levels_dot(const ActBlock* a, int64_t nb, int64_t b, Dot dot) {
  return L == 1 ? dot(a[b]) : 256 * dot(a[b]) + dot(a[nb + b]);
}

template <int L>
float dot_q8_0(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    const int32_t dot = levels_dot<L>(a, nb, b, [&](const ActBlock& ab) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += q[j] * ab.q[j];
      return s;
    });
    sum += load_f16(w) * scale_block<L>(a, nb, b).d * static_cast<float>(dot);
  }
  return sum;
}

// The 4-bit formats' integer dot: low nibbles are elements 0..15, high nibbles 16..31.
int32_t nibble_dot(const uint8_t* qs, const ActBlock& ab) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += (qs[j] & 0x0f) * ab.q[j] + (qs[j] >> 4) * ab.q[j + 16];
  return s;
}

// x = (q - 8) d: d * (d_a * sum q*qa - 8 * d_a * sum qa) = d * (d_a * dot - 8 * s).
template <int L>
float dot_q4_0(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    const int32_t dot = levels_dot<L>(a, nb, b, [&](const ActBlock& ab) { return nibble_dot(w + 2, ab); });
    const ActBlock& as = scale_block<L>(a, nb, b);
    const float d = load_f16(w);
    sum += d * as.d * static_cast<float>(dot) - 8.0f * d * as.s;
  }
  return sum;
}

// x = q d + m: d * d_a * dot + m * s.
template <int L>
float dot_q4_1(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 20) {
    const int32_t dot = levels_dot<L>(a, nb, b, [&](const ActBlock& ab) { return nibble_dot(w + 4, ab); });
    const ActBlock& as = scale_block<L>(a, nb, b);
    sum += load_f16(w) * as.d * static_cast<float>(dot) + load_f16(w + 2) * as.s;
  }
  return sum;
}

// Q4_K super-block of 256 (144 bytes): sub-block j (32 elements, one activation block) has
// x = d*sc_j*q - dmin*m_j, so its dot is d*sc_j*d_a*dot - dmin*m_j*s.
template <int L>
float dot_q4_k(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t sb = 0; sb < nb / 8; ++sb, w += 144) {
    const float d = load_f16(w), dmin = load_f16(w + 2);
    const uint8_t* scales_mins = w + 4;
    const uint8_t* qs = w + 16;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4_k_scale_min(scales_mins, j, &sc, &m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      const int64_t b = sb * 8 + j;
      const int32_t dot = levels_dot<L>(a, nb, b, [&](const ActBlock& ab) {
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) s += ((q[l] >> shift) & 0x0f) * ab.q[l];
        return s;
      });
      const ActBlock& as = scale_block<L>(a, nb, b);
      sum += d * static_cast<float>(sc) * as.d * static_cast<float>(dot) - dmin * static_cast<float>(m) * as.s;
    }
  }
  return sum;
}

// Q6_K super-block of 256 (210 bytes): activation block k of half h holds elements l = 0..31 with
// q = low/high nibble of ql[64h + l + 32(k%2)] | bits 2k..2k+1 of qh[32h + l], and scale
// sc[8h + 2k + l/16]; x = d * sc * (q - 32).
float dot_q6_k(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t sb = 0; sb < nb / 8; ++sb, w += 210, a += 8) {
    const float d = load_f16(w + 208);
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w + 64 * h;
      const uint8_t* qh = w + 128 + 32 * h;
      for (int k = 0; k < 4; ++k) {
        const ActBlock& ab = a[4 * h + k];
        int32_t dot = 0;
        for (int half16 = 0; half16 < 2; ++half16) {
          int32_t part = 0;
          for (int l = 16 * half16; l < 16 * half16 + 16; ++l) {
            const int lo = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
            const int q = lo | (((qh[l] >> (2 * k)) & 3) << 4);
            part += (q - 32) * ab.q[l];
          }
          dot += scales[8 * h + 2 * k + half16] * part;
        }
        sum += d * ab.d * static_cast<float>(dot);
      }
    }
  }
  return sum;
}

// y[m * ldy + n] for tokens m < M, token m's L rows (levels) at a + m * L * nb.
template <int L, float (*Dot)(const uint8_t*, const ActBlock*, int64_t)>
void tile(const uint8_t* w, int64_t row_bytes, const uint8_t* /*packed: SIMD only*/, const ActBlock* a,
          const int8_t* /*tiles: AMX only*/, int64_t M, int64_t nb, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = Dot(w + n * row_bytes, a + m * L * nb, nb);
  }
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{quantize_row,           quantize_residual,      tile<1, dot_q8_0<1>>,
                                 tile<1, dot_q4_0<1>>,   tile<1, dot_q4_1<1>>,   tile<1, dot_q4_k<1>>,
                                 tile<1, dot_q6_k>,      tile<2, dot_q8_0<2>>,   tile<2, dot_q4_0<2>>,
                                 tile<2, dot_q4_1<2>>,   tile<2, dot_q4_k<2>>};
  return table;
}

}  // namespace loom::quant::detail
