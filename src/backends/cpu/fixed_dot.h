// The dot product of the batch-invariant kernels (row_linear.h, paged_attention.h), in one fixed order:
// eight partial sums (lane j takes k = j, j+8, j+16, ... by fused multiply-add, in k order), combined as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the last K mod 8 products added in k order.
// The AVX2 copy and the scalar copy (std::fma) compute exactly this, so a result depends on the two
// vectors only: never on which rows a kernel groups, on the batch, or on the thread count.
// Internal to src/backends/cpu.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_FIXED_DOT_AVX2 1
#endif

namespace loom::cpu::fixed_dot {

#if LOOM_FIXED_DOT_AVX2
using Acc = __m256;
inline Acc zero() { return _mm256_setzero_ps(); }
inline Acc load(const float* p) { return _mm256_loadu_ps(p); }
inline Acc fma(Acc a, Acc b, Acc c) { return _mm256_fmadd_ps(a, b, c); }
inline float finish(Acc acc) {
  // lanes (0..3) + (4..7), then (0+4, 1+5) + (2+6, 3+7) pairwise: the tree above.
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // l0+l4 l1+l5 l2+l6 l3+l7
  __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                     // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#else
struct Acc {
  float l[8];
};
inline Acc zero() { return Acc{}; }
inline Acc load(const float* p) {
  Acc a;
  for (int j = 0; j < 8; ++j) a.l[j] = p[j];
  return a;
}
inline Acc fma(Acc a, Acc b, Acc c) {
  for (int j = 0; j < 8; ++j) c.l[j] = std::fma(a.l[j], b.l[j], c.l[j]);
  return c;
}
inline float finish(Acc a) {
  return ((a.l[0] + a.l[4]) + (a.l[2] + a.l[6])) + ((a.l[1] + a.l[5]) + (a.l[3] + a.l[7]));
}
#endif

// The tail after the vector part: products K8..K-1 added in order.
inline float tail(float sum, const float* a, const float* b, int64_t k8, int64_t K) {
  for (int64_t k = k8; k < K; ++k) sum = std::fma(a[k], b[k], sum);
  return sum;
}

inline float dot(const float* a, const float* b, int64_t K) {
  const int64_t k8 = K - K % 8;
  Acc acc = zero();
  for (int64_t k = 0; k < k8; k += 8) acc = fma(load(a + k), load(b + k), acc);
  return tail(finish(acc), a, b, k8, K);
}
// dot(a, b + i * stride, K) into out[i] for i < 4, each in dot's order: four independent chains, so one
// dot's fused multiply-adds do not wait on each other's latency (a lone dot of 64 is 8 in a row).
inline void dot4(const float* a, const float* b, int64_t stride, int64_t K, float* out) {
  const int64_t k8 = K - K % 8;
  Acc c0 = zero(), c1 = zero(), c2 = zero(), c3 = zero();
  for (int64_t k = 0; k < k8; k += 8) {
    const Acc x = load(a + k);
    c0 = fma(x, load(b + k), c0);
    c1 = fma(x, load(b + stride + k), c1);
    c2 = fma(x, load(b + 2 * stride + k), c2);
    c3 = fma(x, load(b + 3 * stride + k), c3);
  }
  out[0] = tail(finish(c0), a, b, k8, K);
  out[1] = tail(finish(c1), a, b + stride, k8, K);
  out[2] = tail(finish(c2), a, b + 2 * stride, k8, K);
  out[3] = tail(finish(c3), a, b + 3 * stride, k8, K);
}

}  // namespace loom::cpu::fixed_dot
