// Fused softmax + cross-entropy kernels. Legend: N rows, V classes.
//
// Per row, three sweeps over V floats that stay in L1/L2 (V = 10000 is 40 KB):
//   1. m = max(x)                       (16 independent lanes, so the compiler vectorizes it)
//   2. e = exp(x - m), s = sum(e)        (e stored into the gradient row when one is wanted)
//   3. grad = e * (scale / s), grad[t] -= scale
// loss_row = m + log(s) - x[t]: the max subtraction keeps exp from overflowing (the usual stable
// log-sum-exp). exp is a Cephes-style polynomial (Moshier, "Methods and Programs for Mathematical
// Functions"), written so GCC vectorizes it; relative error ~2e-7, enough for a loss and its gradient.
#include "backends/cpu/loss.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"

namespace loom::cpu {
namespace {

constexpr int kLanes = 16;

// exp(x) for x in about [-87, 88]; inputs here are x - max <= 0, clamped below so 2^n stays normal
// (exp(-87) ~ 1.6e-38, indistinguishable from 0 next to the row's largest term, which is 1).
inline float fast_exp(float x) {
  x = std::max(x, -87.0f);
  x = std::min(x, 88.0f);
  // n = round(x / ln 2) with the 1.5 * 2^23 trick: adding it rounds to an integer in the low mantissa bits.
  const float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  // r = x - n ln2, with ln2 split in two (Cody-Waite) so r is exact enough.
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  // 2^n from the rounded integer's bits (t's mantissa holds n + 0x400000).
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  return y * scale;
}

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
