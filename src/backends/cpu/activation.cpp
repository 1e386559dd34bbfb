// The plain std:: oracles of the activation kernels. The kernels themselves are activation.inc,
// compiled once per instruction set (isa.h) and chosen at run time by dispatch.cpp. Legend and
// conventions: see activation.h.
#include "backends/cpu/activation.h"

#include <cmath>

#include "core/rng.h"

namespace loom::cpu {

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
