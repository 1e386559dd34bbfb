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
    blk.pad = 0;
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
  }
}

// Each format: the dot product of weight row `w` with activation row `a` over nb blocks of 32.

float dot_q8_0(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    int32_t dot = 0;
    for (int j = 0; j < 32; ++j) dot += q[j] * a[b].q[j];
    sum += load_f16(w) * a[b].d * static_cast<float>(dot);
  }
  return sum;
}

// x = (q - 8) d: d * (d_a * sum q*qa - 8 * d_a * sum qa) = d * (d_a * dot - 8 * s).
float dot_q4_0(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    const uint8_t* qs = w + 2;
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) dot += (qs[j] & 0x0f) * a[b].q[j] + (qs[j] >> 4) * a[b].q[j + 16];
    const float d = load_f16(w);
    sum += d * a[b].d * static_cast<float>(dot) - 8.0f * d * a[b].s;
  }
  return sum;
}

// x = q d + m: d * d_a * dot + m * s.
float dot_q4_1(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 20) {
    const uint8_t* qs = w + 4;
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) dot += (qs[j] & 0x0f) * a[b].q[j] + (qs[j] >> 4) * a[b].q[j + 16];
    sum += load_f16(w) * a[b].d * static_cast<float>(dot) + load_f16(w + 2) * a[b].s;
  }
  return sum;
}

// Q4_K super-block of 256 (144 bytes): sub-block j (32 elements, one activation block) has
// x = d*sc_j*q - dmin*m_j, so its dot is d*sc_j*d_a*dot - dmin*m_j*s.
float dot_q4_k(const uint8_t* w, const ActBlock* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t sb = 0; sb < nb / 8; ++sb, w += 144, a += 8) {
    const float d = load_f16(w), dmin = load_f16(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* qs = w + 16;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4_k_scale_min(scales, j, &sc, &m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((q[l] >> shift) & 0x0f) * a[j].q[l];
      sum += d * static_cast<float>(sc) * a[j].d * static_cast<float>(dot) - dmin * static_cast<float>(m) * a[j].s;
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

template <float (*Dot)(const uint8_t*, const ActBlock*, int64_t)>
void tile(const uint8_t* w, int64_t row_bytes, const uint8_t* /*packed: SIMD only*/, const ActBlock* a, int64_t M,
          int64_t nb, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = Dot(w + n * row_bytes, a + m * nb, nb);
  }
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{quantize_row, tile<dot_q8_0>, tile<dot_q4_0>, tile<dot_q4_1>, tile<dot_q4_k>,
                                 tile<dot_q6_k>};
  return table;
}

}  // namespace loom::quant::detail
