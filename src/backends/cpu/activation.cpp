// CPU kernels for activations, SwiGLU and dropout: the run-time choice of instruction set, and the
// plain std:: oracles. The kernels themselves are activation.inc, compiled once per instruction set
// (isa.h). Legend and conventions: see activation.h.
#include "backends/cpu/activation.h"

#include <cmath>

#include "backends/cpu/isa.h"
#include "backends/cpu/kernels.h"

namespace loom::cpu {

void silu_forward(float* y, const float* x, int64_t n) { LOOM_CPU_DISPATCH(silu_forward, y, x, n); }
void silu_forward(bf16* y, const bf16* x, int64_t n) { LOOM_CPU_DISPATCH(silu_forward, y, x, n); }
void silu_backward(float* dx, const float* dy, const float* x, int64_t n) { LOOM_CPU_DISPATCH(silu_backward, dx, dy, x, n); }
void silu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n) { LOOM_CPU_DISPATCH(silu_backward, dx, dy, x, n); }

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_forward, y, x, n, tanh_approximation);
}
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_forward, y, x, n, tanh_approximation);
}
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_backward, dx, dy, x, n, tanh_approximation);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation) {
  LOOM_CPU_DISPATCH(gelu_backward, dx, dy, x, n, tanh_approximation);
}

void swiglu_forward(float* y, const float* gate, const float* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_forward, y, gate, up, n);
}
void swiglu_forward(bf16* y, const bf16* gate, const bf16* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_forward, y, gate, up, n);
}
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_backward, dgate, dup, dy, gate, up, n);
}
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up, int64_t n) {
  LOOM_CPU_DISPATCH(swiglu_backward, dgate, dup, dy, gate, up, n);
}

void dropout_forward(float* y, const float* x, int64_t n, float p, RngKey key) {
  LOOM_CPU_DISPATCH(dropout_forward, y, x, n, p, key);
}
void dropout_forward(bf16* y, const bf16* x, int64_t n, float p, RngKey key) {
  LOOM_CPU_DISPATCH(dropout_forward, y, x, n, p, key);
}

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
