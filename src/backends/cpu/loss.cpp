// Fused softmax + cross-entropy kernels. Legend: N rows, V classes.
//
// Per row, three sweeps over V floats that stay in L1/L2 (V = 10000 is 40 KB):
//   1. m = max(x)                       (16 independent lanes, so the compiler vectorizes it)
//   2. e = exp(x - m), s = sum(e)        (e stored into the gradient row when one is wanted)
//   3. grad = e * (scale / s), grad[t] -= scale
// loss_row = m + log(s) - x[t]: the max subtraction keeps exp from overflowing (the usual stable
// log-sum-exp). exp is a Cephes-style polynomial (Moshier, "Methods and Programs for Mathematical
// Functions"), relative error ~2e-7, enough for a loss and its gradient. With AVX-512 the sweeps are
// written with intrinsics (16 lanes, masked tails): GCC's auto-vectorized version ran ~4x slower. The
// portable version below is the fallback for other ISAs. Either way every row is summed in a fixed order.
#include "backends/cpu/loss.h"

// GCC 12 flags its own AVX-512 intrinsic headers (_mm512_undefined_*) with false positives under -Wall.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/fast_exp.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

constexpr int kLanes = 16;

#if defined(__AVX512F__)

float row_max(const float* x, int64_t V) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 m0 = neg_inf, m1 = neg_inf;
  int64_t i = 0;
  for (; i + 32 <= V; i += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
  }
  for (; i < V; i += 16) {
    const __mmask16 k = tail_mask(V - i);
    m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(neg_inf, k, x + i));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

float row_exp_sum(const float* x, int64_t V, float m, float* e) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= V; i += 32) {
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv));
    if (e != nullptr) {
      _mm512_storeu_ps(e + i, e0);
      _mm512_storeu_ps(e + i + 16, e1);
    }
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; i < V; i += 16) {
    const __mmask16 k = tail_mask(V - i);
    const __m512 ev = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
    if (e != nullptr) _mm512_mask_storeu_ps(e + i, k, ev);
    s0 = _mm512_mask_add_ps(s0, k, s0, ev);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

#else  // portable: 16 independent lanes that the compiler can vectorize

float row_max(const float* x, int64_t V) {
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  }
  float m = -INFINITY;
  for (int l = 0; l < kLanes; ++l) m = std::max(m, lanes[l]);
  for (; i < V; ++i) m = std::max(m, x[i]);
  return m;
}

// sum(exp(x - m)); stores the exponentials into e when e is not null.
float row_exp_sum(const float* x, int64_t V, float m, float* e) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  if (e != nullptr) {
    for (; i + kLanes <= V; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const float v = fast_exp(x[i + l] - m);
        e[i + l] = v;
        lanes[l] += v;
      }
    }
  } else {
    for (; i + kLanes <= V; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) lanes[l] += fast_exp(x[i + l] - m);
    }
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  for (; i < V; ++i) {
    const float v = fast_exp(x[i] - m);
    if (e != nullptr) e[i] = v;
    s += v;
  }
  return s;
}

#endif

}  // namespace

int64_t cross_entropy_count(const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index,
                            int64_t* first_bad) {
  int64_t count = 0;
  *first_bad = -1;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t == ignore_index) continue;
    if ((t < 0 || t >= V) && *first_bad < 0) *first_bad = n;
    ++count;
  }
  return count;
}

double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                             int32_t ignore_index, float* grad, float grad_scale) {
  std::vector<double> row_loss(static_cast<size_t>(N), 0.0);
  parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = logits + n * V;
      float* g = grad != nullptr ? grad + n * V : nullptr;
      const int32_t t = targets[n];
      if (t == ignore_index) {
        if (g != nullptr) std::memset(g, 0, static_cast<size_t>(V) * sizeof(float));
        continue;
      }
      const float m = row_max(x, V);
      const float s = row_exp_sum(x, V, m, g);
      row_loss[static_cast<size_t>(n)] =
          static_cast<double>(m) + std::log(static_cast<double>(s)) - static_cast<double>(x[t]);
      if (g != nullptr) {
        const float k = grad_scale / s;
        for (int64_t i = 0; i < V; ++i) g[i] *= k;
        g[t] -= grad_scale;
      }
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;
  return total;
}

void scale_inplace(float* x, float s, int64_t n) {
  parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

double cross_entropy_reference(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                               int32_t ignore_index, float* grad, float grad_scale) {
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    const int32_t t = targets[n];
    if (t == ignore_index) {
      if (grad != nullptr) std::fill(grad + n * V, grad + (n + 1) * V, 0.0f);
      continue;
    }
    double m = -INFINITY;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(x[i]));
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] - m);
    total += m + std::log(s) - x[t];
    if (grad != nullptr) {
      for (int64_t i = 0; i < V; ++i) {
        grad[n * V + i] = static_cast<float>((std::exp(x[i] - m) / s - (i == t ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  return total;
}

}  // namespace loom::cpu
