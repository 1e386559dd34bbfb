// CPU kernels for activations, SwiGLU and dropout. Legend and conventions: see activation.h.
//
// Each kernel is one `omp simd` loop per chunk of kGrain elements, chunks spread over threads with
// parallel_for. Chunks depend only on n, and each element's value only on its own inputs (and, for
// dropout, its index), so results are the same for every thread count. `simdlen(16)` asks for full
// AVX-512 vectors: GCC's Sapphire Rapids tuning otherwise prefers 256-bit ones, and the exp/erf loops
// are compute-bound enough for that to show (single thread: silu forward at ~80% of copy bandwidth).
#include "backends/cpu/activation.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX512F__)
// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics at -O3 (GCC bug
// 105593, the _mm512_undefined_* placeholders); the intrinsics themselves are fine.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#include "backends/cpu/simd_math.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

using simd::load;
using simd::store;

constexpr int64_t kGrain = 1 << 14;  // elements per chunk; a multiple of 64 (dropout's Philox tiles)
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluTanhCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

inline float silu_grad(float x) {
  const float s = simd::sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

inline float gelu_value(float x, bool tanh_approximation) {
  if (tanh_approximation) {
    const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
    return x * simd::sigmoid(2.0f * u);
  }
  return 0.5f * x * (1.0f + simd::erf(x * kInvSqrt2));
}

inline float gelu_grad(float x, bool tanh_approximation) {
  if (tanh_approximation) {
    // Beyond |x| = 20 the gradient is 0 or 1 in f32 (s(1-s) < 1e-30); clamping keeps x^3 and
    // x * s(1-s) from producing inf * 0 = NaN for huge |x|.
    const float xc = x < -20.0f ? -20.0f : (x > 20.0f ? 20.0f : x);
    const float u = kSqrt2OverPi * (xc + kGeluTanhCubic * xc * xc * xc);
    const float s = simd::sigmoid(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * xc * xc);
    return s + 2.0f * xc * s * (1.0f - s) * du;
  }
  const float cdf = 0.5f * (1.0f + simd::erf(x * kInvSqrt2));
  return cdf + x * kInvSqrt2Pi * simd::exp(-0.5f * x * x);
}

template <typename T>
void silu_forward_impl(T* y, const T* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd simdlen(16)
    for (int64_t i = b; i < e; ++i) {
      const float v = load(x, i);
      store(y, i, v * simd::sigmoid(v));
    }
  });
}

template <typename T>
void silu_backward_impl(T* dx, const T* dy, const T* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd simdlen(16)
    for (int64_t i = b; i < e; ++i) store(dx, i, load(dy, i) * silu_grad(load(x, i)));
  });
}

// The branch on the approximation is hoisted out of the loop (one loop per variant), so each loop
// vectorises without a blend of both formulas.
template <typename T>
void gelu_forward_impl(T* y, const T* x, int64_t n, bool tanh_approximation) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    if (tanh_approximation) {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) store(y, i, gelu_value(load(x, i), true));
    } else {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) store(y, i, gelu_value(load(x, i), false));
    }
  });
}

template <typename T>
void gelu_backward_impl(T* dx, const T* dy, const T* x, int64_t n, bool tanh_approximation) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    if (tanh_approximation) {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) store(dx, i, load(dy, i) * gelu_grad(load(x, i), true));
    } else {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) store(dx, i, load(dy, i) * gelu_grad(load(x, i), false));
    }
  });
}

template <typename T>
void swiglu_forward_impl(T* y, const T* gate, const T* up, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd simdlen(16)
    for (int64_t i = b; i < e; ++i) {
      const float g = load(gate, i);
      store(y, i, g * simd::sigmoid(g) * load(up, i));
    }
  });
}

template <typename T>
void swiglu_backward_impl(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    if (dgate != nullptr && dup != nullptr) {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) {
        const float g = load(gate, i), u = load(up, i), d = load(dy, i);
        const float s = simd::sigmoid(g);
        store(dgate, i, d * u * (s * (1.0f + g * (1.0f - s))));  // = d * u * silu_grad(g)
        store(dup, i, d * (g * s));
      }
    } else if (dgate != nullptr) {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) store(dgate, i, load(dy, i) * load(up, i) * silu_grad(load(gate, i)));
    } else if (dup != nullptr) {
#pragma omp simd simdlen(16)
      for (int64_t i = b; i < e; ++i) {
        const float g = load(gate, i);
        store(dup, i, load(dy, i) * (g * simd::sigmoid(g)));
      }
    }
  });
}

// ---- dropout ------------------------------------------------------------------------------------

// Philox4x32-10, the same rounds as core/rng.cpp's philox4x32 (which stays the definition; the tests
// check that the dropout mask agrees with random_uniform bit for bit). Scalar: the portable path of
// philox_tile below.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

inline void philox_block(uint64_t block, uint32_t key0, uint32_t key1, uint32_t& o0, uint32_t& o1,
                         uint32_t& o2, uint32_t& o3) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  o0 = c0;
  o1 = c1;
  o2 = c2;
  o3 = c3;
}

// 64 random words, element order, for elements 4*first .. 4*first + 63 (blocks first .. first + 15);
// `first` must be a multiple of 16 so that the low counter word does not carry within the tile.
#if defined(__AVX512F__)
// AVX-512: 16 blocks side by side, one per lane. The 32x32->64-bit products come from vpmuludq on the
// even and (shifted) odd lanes; GCC's own vectorisation of philox_block widens to 64-bit lanes and uses
// the slow vpmullq. The four output words are then transposed into element order.
inline void philox_tile(uint64_t first, uint32_t key0, uint32_t key1, uint32_t* bits) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))), lane);
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  __m512i k0 = _mm512_set1_epi32(static_cast<int>(key0)), k1 = _mm512_set1_epi32(static_cast<int>(key1));
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0)), m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m512i w0 = _mm512_set1_epi32(static_cast<int>(kPhiloxW0)), w1 = _mm512_set1_epi32(static_cast<int>(kPhiloxW1));
  constexpr __mmask16 kOdd = 0xAAAA;
  for (int round = 0; round < 10; ++round) {
    const __m512i pe0 = _mm512_mul_epu32(c0, m0), po0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
    const __m512i pe1 = _mm512_mul_epu32(c2, m1), po1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
    const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, pe0, _mm512_slli_epi64(po0, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(pe0, 32), po0);
    const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, pe1, _mm512_slli_epi64(po1, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(pe1, 32), po1);
    c0 = _mm512_ternarylogic_epi32(hi1, c1, k0, 0x96);  // hi1 ^ c1 ^ k0
    c2 = _mm512_ternarylogic_epi32(hi0, c3, k1, 0x96);  // hi0 ^ c3 ^ k1
    c1 = lo1;
    c3 = lo0;
    k0 = _mm512_add_epi32(k0, w0);
    k1 = _mm512_add_epi32(k1, w1);
  }
  // c_j lane b holds word j of block b; element 4b + j wants it. 4x4 transpose of 32-bit words within
  // each 128-bit lane, then of 128-bit lanes across the four registers.
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);  // blocks 0,4,8,12 | 1,5,9,13
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);  // blocks 2,6,10,14 | 3,7,11,15
  const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);  // 0,4,1,5 | 2,6,3,7
  const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);  // 8,12,9,13 | 10,14,11,15
  _mm512_storeu_si512(bits, _mm512_shuffle_i32x4(v0, v1, 0x88));       // blocks 0..3
  _mm512_storeu_si512(bits + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));  // blocks 4..7
  _mm512_storeu_si512(bits + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));  // blocks 8..11
  _mm512_storeu_si512(bits + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));  // blocks 12..15
}
#else
inline void philox_tile(uint64_t first, uint32_t key0, uint32_t key1, uint32_t* bits) {
  for (int k = 0; k < 16; ++k) {
    philox_block(first + static_cast<uint64_t>(k), key0, key1, bits[4 * k], bits[4 * k + 1], bits[4 * k + 2],
                 bits[4 * k + 3]);
  }
}
#endif

// Element i is dropped iff random_uniform(key, i) = (bits >> 8) * 2^-24 < p, i.e. iff the integer
// (bits >> 8) < ceil(p * 2^24): the comparison is exact, so the mask matches random_uniform bit for bit.
uint32_t drop_threshold(float p) { return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0)); }

template <typename T>
void dropout_forward_impl(T* y, const T* x, int64_t n, float p, RngKey key) {
  static_assert(kGrain % 64 == 0, "chunks must start on a 64-element Philox tile");
  const uint32_t threshold = drop_threshold(p);
  const float scale = 1.0f / (1.0f - p);
  parallel_for(0, n, kGrain, [&, x, y](int64_t b, int64_t e) {
    // x, y are captured by value: through the closure (by reference) GCC reloads them under the mask
    // of the select below and gives up vectorising ("no vectype for .MASK_LOAD").
    alignas(64) uint32_t bits[64];
    int64_t t = b;
    for (; t + 64 <= e; t += 64) {
      philox_tile(static_cast<uint64_t>(t) / 4, key.k0, key.k1, bits);
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < 64; ++j) {
        const float v = load(x, t + j) * scale;
        store(y, t + j, (bits[j] >> 8) >= threshold ? v : 0.0f);
      }
    }
    for (int64_t i = t; i < e; ++i) {
      const bool keep = (random_bits(key, static_cast<uint64_t>(i)) >> 8) >= threshold;
      store(y, i, keep ? load(x, i) * scale : 0.0f);
    }
  });
}

}  // namespace

void silu_forward(float* y, const float* x, int64_t n) { silu_forward_impl(y, x, n); }
void silu_forward(bf16* y, const bf16* x, int64_t n) { silu_forward_impl(y, x, n); }
void silu_backward(float* dx, const float* dy, const float* x, int64_t n) { silu_backward_impl(dx, dy, x, n); }
void silu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n) { silu_backward_impl(dx, dy, x, n); }

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approximation) {
  gelu_forward_impl(y, x, n, tanh_approximation);
}
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_approximation) {
  gelu_forward_impl(y, x, n, tanh_approximation);
}
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation) {
  gelu_backward_impl(dx, dy, x, n, tanh_approximation);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation) {
  gelu_backward_impl(dx, dy, x, n, tanh_approximation);
}

void swiglu_forward(float* y, const float* gate, const float* up, int64_t n) { swiglu_forward_impl(y, gate, up, n); }
void swiglu_forward(bf16* y, const bf16* gate, const bf16* up, int64_t n) { swiglu_forward_impl(y, gate, up, n); }
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  swiglu_backward_impl(dgate, dup, dy, gate, up, n);
}
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up, int64_t n) {
  swiglu_backward_impl(dgate, dup, dy, gate, up, n);
}

void dropout_forward(float* y, const float* x, int64_t n, float p, RngKey key) { dropout_forward_impl(y, x, n, p, key); }
void dropout_forward(bf16* y, const bf16* x, int64_t n, float p, RngKey key) { dropout_forward_impl(y, x, n, p, key); }

// ---- plain std:: oracles ------------------------------------------------------------------------

void silu_forward_reference(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(v / (1.0 + std::exp(-v)));
  }
}

void silu_backward_reference(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i], s = 1.0 / (1.0 + std::exp(-v));
    dx[i] = static_cast<float>(dy[i] * s * (1.0 + v * (1.0 - s)));
  }
}

void gelu_forward_reference(float* y, const float* x, int64_t n, bool tanh_approximation) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    if (tanh_approximation) {
      y[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    } else {
      y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * 0.7071067811865476)));
    }
  }
}

void gelu_backward_reference(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double d;
    if (tanh_approximation) {
      const double t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
      d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
    } else {
      d = 0.5 * (1.0 + std::erf(v * 0.7071067811865476)) + v * 0.3989422804014327 * std::exp(-0.5 * v * v);
    }
    dx[i] = static_cast<float>(dy[i] * d);
  }
}

void dropout_forward_reference(float* y, const float* x, int64_t n, float p, RngKey key) {
  const float scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) y[i] = random_uniform(key, static_cast<uint64_t>(i)) < p ? 0.0f : x[i] * scale;
}

}  // namespace loom::cpu
