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

#include "backends/cpu/philox.h"
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

template <typename T>
void dropout_forward_impl(T* y, const T* x, int64_t n, float p, RngKey key) {
  static_assert(kGrain % 64 == 0, "chunks must start on a 64-element Philox tile");
  const uint32_t threshold = philox::drop_threshold(p);
  const float scale = 1.0f / (1.0f - p);
  parallel_for(0, n, kGrain, [&, x, y](int64_t b, int64_t e) {
    // x, y are captured by value: through the closure (by reference) GCC reloads them under the mask
    // of the select below and gives up vectorising ("no vectype for .MASK_LOAD").
    alignas(64) uint32_t bits[64];
    int64_t t = b;
    for (; t + 64 <= e; t += 64) {
      philox::philox_tile(static_cast<uint64_t>(t) / 4, key.k0, key.k1, bits);
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
