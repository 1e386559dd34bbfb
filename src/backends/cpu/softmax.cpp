// Softmax kernels. Rows are independent and each is reduced in a fixed order, so results are bitwise
// the same whatever the thread count.
#include "backends/cpu/softmax.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/parallel.h"

namespace loom::cpu {
namespace {

using simd::f32x16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kGrainElements = 16384;  // about 64 KiB of input per parallel chunk

// p[i] = e^p[i] for i < n.
void exp_inplace(float* p, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) simd::store(p + j, simd::exp(simd::load(p + j)));
  if (j < n) {
    float tail[16];
    std::fill(tail, tail + 16, kNegInf);
    std::copy(p + j, p + n, tail);
    simd::store(tail, simd::exp(simd::load(tail)));
    std::copy(tail, tail + (n - j), p + j);
  }
}

// One contiguous row: y[0..n) = softmax(x[0..n)).
void softmax_row(float* y, const float* x, int64_t n) {
  f32x16 vm = simd::splat(kNegInf);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) vm = simd::vmax(vm, simd::load(x + j));
  float m = simd::reduce_max(vm);
  for (; j < n; ++j) m = std::max(m, x[j]);
  if (m == kNegInf) {  // nothing to attend to: zeros, not (-inf) - (-inf) = NaN
    std::fill(y, y + n, 0.0f);
    return;
  }
  for (j = 0; j < n; ++j) y[j] = x[j] - m;
  exp_inplace(y, n);
  f32x16 vs{};
  for (j = 0; j + 16 <= n; j += 16) vs += simd::load(y + j);
  float s = simd::reduce_sum(vs);
  for (; j < n; ++j) s += y[j];
  const float inv = 1.0f / s;
  for (j = 0; j < n; ++j) y[j] *= inv;
}

// One [n, inner] slab, softmax over n for every inner column; vectorised across the inner columns.
void softmax_slab(float* y, const float* x, int64_t n, int64_t inner, std::vector<float>& mx,
                  std::vector<float>& sum) {
  mx.assign(static_cast<size_t>(inner), kNegInf);
  sum.assign(static_cast<size_t>(inner), 0.0f);
  for (int64_t d = 0; d < n; ++d)
    for (int64_t i = 0; i < inner; ++i) mx[i] = std::max(mx[i], x[d * inner + i]);
  for (int64_t i = 0; i < inner; ++i)
    if (mx[i] == kNegInf) mx[i] = 0.0f;  // all -inf: e^(-inf - 0) = 0 below, and the sum stays 0
  for (int64_t d = 0; d < n; ++d) {
    float* yr = y + d * inner;
    for (int64_t i = 0; i < inner; ++i) yr[i] = x[d * inner + i] - mx[i];
    exp_inplace(yr, inner);
    for (int64_t i = 0; i < inner; ++i) sum[i] += yr[i];
  }
  for (int64_t i = 0; i < inner; ++i) sum[i] = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
  for (int64_t d = 0; d < n; ++d)
    for (int64_t i = 0; i < inner; ++i) y[d * inner + i] *= sum[i];
}

}  // namespace

void softmax_forward(float* y, const float* x, int64_t outer, int64_t n, int64_t inner) {
  if (outer == 0 || n == 0 || inner == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (n * inner));
  if (inner == 1) {
    parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) softmax_row(y + o * n, x + o * n, n);
    });
    return;
  }
  parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
    std::vector<float> mx, sum;
    for (int64_t o = b; o < e; ++o) softmax_slab(y + o * n * inner, x + o * n * inner, n, inner, mx, sum);
  });
}

void softmax_backward(float* dx, const float* y, const float* dy, int64_t outer, int64_t n, int64_t inner) {
  if (outer == 0 || n == 0 || inner == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (n * inner));
  if (inner == 1) {
    parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const float* yr = y + o * n;
        const float* gr = dy + o * n;
        float* dr = dx + o * n;
        f32x16 vd{};
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) vd += simd::load(yr + j) * simd::load(gr + j);
        float dot = simd::reduce_sum(vd);
        for (; j < n; ++j) dot += yr[j] * gr[j];
        for (j = 0; j < n; ++j) dr[j] = yr[j] * (gr[j] - dot);
      }
    });
    return;
  }
  parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
    std::vector<float> dot;
    for (int64_t o = b; o < e; ++o) {
      const float* ys = y + o * n * inner;
      const float* gs = dy + o * n * inner;
      float* ds = dx + o * n * inner;
      dot.assign(static_cast<size_t>(inner), 0.0f);
      for (int64_t d = 0; d < n; ++d)
        for (int64_t i = 0; i < inner; ++i) dot[i] += ys[d * inner + i] * gs[d * inner + i];
      for (int64_t d = 0; d < n; ++d)
        for (int64_t i = 0; i < inner; ++i) ds[d * inner + i] = ys[d * inner + i] * (gs[d * inner + i] - dot[i]);
    }
  });
}

}  // namespace loom::cpu
