#include "backends/cpu/elementwise.h"

#include "core/parallel.h"

#include <immintrin.h>
#include <cstring>

namespace loom::cpu {

namespace {
constexpr int64_t kGrain = 1 << 15;
}

void add_forward(float* out, const float* a, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

void add_inplace(float* out, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] += b[i];
  });
}

void mul_forward(float* out, const float* a, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] * b[i];
  });
}

void scale_forward(float* out, const float* a, float scale, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] * scale;
  });
}

void axpby(float* out, float alpha, const float* a, float beta, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = alpha * a[i] + beta * b[i];
  });
}

double sum(const float* a, int64_t n) {
  return parallel_reduce_chunks<double>(0, n, kGrain, 0.0, [&](int64_t s, int64_t e) {
    double acc = 0.0;
    for (int64_t i = s; i < e; ++i) acc += a[i];
    return acc;
  });
}

void convert_f32_to_bf16(const float* in, bf16* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
    int64_t i = s;
#if defined(__AVX512BF16__)
    for (; i + 16 <= e; i += 16) {
      __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
      std::memcpy(out + i, &v, 32);
    }
#endif
    for (; i < e; ++i) out[i] = bf16::from_float(in[i]);
  });
}

}  // namespace loom::cpu
