// CUDA kernels for the activations family: silu, gelu (exact and tanh), the SwiGLU gate and dropout,
// with the contracts of backends/cpu/activation.h (f32 or bf16 buffers, f32 math, one rounding on store;
// a null output is "not wanted"), on device memory, queued on ctx's stream. The per-element formulas are
// the CPU's (gelu's tanh form as x * sigmoid(2u), its gradient clamped beyond |x| = 20); expf/erff are
// the GPU's, so values agree with the CPU's polynomial approximations to a few ulp, not bit for bit.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace loom::cuda {

void silu_forward(const Context& ctx, float* y, const float* x, int64_t n);
void silu_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n);
void silu_backward(const Context& ctx, float* dx, const float* dy, const float* x, int64_t n);
void silu_backward(const Context& ctx, bf16* dx, const bf16* dy, const bf16* x, int64_t n);
void gelu_forward(const Context& ctx, float* y, const float* x, int64_t n, bool tanh_approximation);
void gelu_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n, bool tanh_approximation);
void gelu_backward(const Context& ctx, float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation);
void gelu_backward(const Context& ctx, bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation);
void swiglu_forward(const Context& ctx, float* y, const float* gate, const float* up, int64_t n);
void swiglu_forward(const Context& ctx, bf16* y, const bf16* gate, const bf16* up, int64_t n);
void swiglu_backward(const Context& ctx, float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                     int64_t n);
void swiglu_backward(const Context& ctx, bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up,
                     int64_t n);

// Inverted dropout, y[i] = keep(i) ? x[i] * (1 / (1 - p)) : 0 with keep(i) = !(random_uniform(key, i) < p):
// the CPU's mask and arithmetic, so y equals cpu::dropout_forward's bit for bit. The backward is the same
// call on dy (same key: same mask). y may equal x.
void dropout_forward(const Context& ctx, float* y, const float* x, int64_t n, float p, RngKey key);
void dropout_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n, float p, RngKey key);

}  // namespace loom::cuda
