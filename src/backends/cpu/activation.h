// CPU kernels for element-wise activations, the fused SwiGLU gate and dropout.
//
// Legend: n the element count (any shape, flattened: every buffer is contiguous and n long).
// Conventions:
//   * Each kernel exists for f32 and bf16 buffers (bf16 widened to f32 for the math, rounded once on
//     store). All buffers of one call share the dtype, except the mixed-precision forwards of gelu and
//     swiglu: f32 inputs, a bf16 y (the operand of the bf16 GEMM that reads it).
//   * Outputs are overwritten; a null output pointer means "not wanted".
//   * Forward and backward are each one pass over memory: the backward recomputes sigmoid/erf from the
//     saved input rather than reading a saved intermediate.
//   * exp/erf are the vectorisable approximations of simd_math.h (f32, a few ulp).
//   * The *_reference kernels are the plain std:: (double) versions, kept as the test oracle. f32 only.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/rng.h"

namespace loom::cpu {

// y = x * sigmoid(x);   dx = dy * s * (1 + x * (1 - s)), s = sigmoid(x).
void silu_forward(float* y, const float* x, int64_t n);
void silu_forward(bf16* y, const bf16* x, int64_t n);
void silu_backward(float* dx, const float* dy, const float* x, int64_t n);
void silu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n);

// Exact: y = x * Phi(x), Phi(x) = (1 + erf(x/sqrt(2))) / 2;  dx = dy * (Phi(x) + x * phi(x)).
// tanh (GPT-2): y = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3), computed as x * sigmoid(2u)
// (the same function: 1 + tanh(u) = 2 sigmoid(2u)), which has no cancellation for negative x.
void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approximation);
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_approximation);
void gelu_forward(bf16* y, const float* x, int64_t n, bool tanh_approximation);  // mixed precision
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation);
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation);

// y = silu(gate) * up;  dgate = dy * up * s * (1 + gate * (1 - s)),  dup = dy * silu(gate).
void swiglu_forward(float* y, const float* gate, const float* up, int64_t n);
void swiglu_forward(bf16* y, const bf16* gate, const bf16* up, int64_t n);
void swiglu_forward(bf16* y, const float* gate, const float* up, int64_t n);  // mixed precision
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n);
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up, int64_t n);

// Inverted dropout, y[i] = keep(i) ? x[i] / (1 - p) : 0, with keep(i) = !(random_uniform(key, i) < p).
// The same call applied to dy is the backward (the mask is recomputed from the key: nothing is saved).
// Philox blocks are computed once per 4 elements (element i uses word i % 4 of block i / 4, exactly as
// random_bits), so this is bitwise the same mask as random_uniform, whatever the thread count.
void dropout_forward(float* y, const float* x, int64_t n, float p, RngKey key);
void dropout_forward(bf16* y, const bf16* x, int64_t n, float p, RngKey key);

// ---- plain std:: oracles (double precision inside) -----------------------------------------------
void silu_forward_reference(float* y, const float* x, int64_t n);
void silu_backward_reference(float* dx, const float* dy, const float* x, int64_t n);
void gelu_forward_reference(float* y, const float* x, int64_t n, bool tanh_approximation);
void gelu_backward_reference(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation);
void dropout_forward_reference(float* y, const float* x, int64_t n, float p, RngKey key);

}  // namespace loom::cpu
