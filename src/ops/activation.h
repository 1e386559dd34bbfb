// Element-wise activations, differentiable. All take f32 or bf16 (f32 math inside; results and input
// gradients in the input's dtype).
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::ops {

enum class GeluApproximation { None, Tanh };  // exact (erf) or GPT-2's tanh approximation

Tensor silu(const Tensor& x);                                              // x * sigmoid(x)
Tensor gelu(const Tensor& x, GeluApproximation approx = GeluApproximation::None);

// The SwiGLU gate, fused: silu(gate) * up. gate, up: same shape [..., F].
Tensor swiglu(const Tensor& gate, const Tensor& up);

// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
// Element i is dropped iff random_uniform(key, i) < p, so the mask depends only on (key, i): the same
// whatever the thread count. Identity when !training or p == 0. p must be in [0, 1).
Tensor dropout(const Tensor& x, float p, RngKey key, bool training = true);

}  // namespace loom::ops
