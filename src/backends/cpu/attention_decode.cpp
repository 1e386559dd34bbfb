#include "backends/cpu/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/simd_math.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace loom::cpu {

namespace {

// scores[j] = q . k_j for j in [0, n).
void dot_keys(float* scores, const float* q, const float* k, int64_t k_stride, int64_t n, int64_t d) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // 4 keys at a time, 8 lanes of D each; one horizontal pass (3 hadds) sums the four at once.
  if (d % 8 == 0) {
    for (; j + 4 <= n; j += 4) {
      const float* k0 = k + j * k_stride;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + k_stride + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * k_stride + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * k_stride + i), a3);
      }
      const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      _mm_storeu_ps(scores + j, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
    }
  }
#endif
  for (; j < n; ++j) {
    const float* kj = k + j * k_stride;
    float s = 0.0f;
#pragma omp simd simdlen(8) reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += q[i] * kj[i];
    scores[j] = s;
  }
}

// out[Dv] = sum_j p_j v_j.
void weighted_rows(float* out, const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dv) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // 32 outputs at a time stay in registers over all n rows.
  for (; i + 32 <= dv; i += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = v + j * v_stride + i;
      const __m256 pj = _mm256_broadcast_ss(p + j);
      a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
    }
    _mm256_storeu_ps(out + i, a0);
    _mm256_storeu_ps(out + i + 8, a1);
    _mm256_storeu_ps(out + i + 16, a2);
    _mm256_storeu_ps(out + i + 24, a3);
  }
#endif
  for (int64_t c = i; c < dv; ++c) out[c] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * v_stride;
    const float pj = p[j];
#pragma omp simd simdlen(8)
    for (int64_t c = i; c < dv; ++c) out[c] += pj * vj[c];
  }
}

}  // namespace

void attention_decode_row(float* out, const float* q, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, int64_t n, int64_t d, int64_t dv, float scale, float* scores) {
  dot_keys(scores, q, k, k_stride, n, d);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    scores[j] *= scale;
    m = std::max(m, scores[j]);
  }
  // A NaN score (from a NaN in q or k) leaves m finite or -inf; exp(NaN - m) is NaN and reaches out,
  // as in the flash kernels.
  float sum = 0.0f;
#pragma omp simd simdlen(8) reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = simd::exp(scores[j] - m);
    sum += scores[j];
  }
  weighted_rows(out, scores, v, v_stride, n, dv);
  const float inv = 1.0f / sum;
#pragma omp simd simdlen(8)
  for (int64_t i = 0; i < dv; ++i) out[i] *= inv;
}

void attention_decode_row_reference(float* out, const float* q, const float* k, int64_t k_stride, const float* v,
                                    int64_t v_stride, int64_t n, int64_t d, int64_t dv, float scale) {
  std::vector<double> s(static_cast<size_t>(n));
  double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[j * k_stride + i];
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  for (int64_t i = 0; i < dv; ++i) {
    double acc = 0.0;
    for (int64_t j = 0; j < n; ++j) acc += s[j] * v[j * v_stride + i];
    out[i] = static_cast<float>(acc / sum);
  }
}

}  // namespace loom::cpu
