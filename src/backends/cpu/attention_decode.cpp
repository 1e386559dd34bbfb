#include "backends/cpu/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/simd_math.h"

namespace loom::cpu {

void attention_decode_row(float* out, const float* q, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, int64_t n, int64_t d, int64_t dv, float scale, float* scores) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = k + j * k_stride;
    float s = 0.0f;
#pragma omp simd simdlen(8) reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += q[i] * kj[i];
    scores[j] = s * scale;
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
  for (int64_t i = 0; i < dv; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * v_stride;
    const float p = scores[j];
#pragma omp simd simdlen(8)
    for (int64_t i = 0; i < dv; ++i) out[i] += p * vj[i];
  }
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
