// Element-wise activations, differentiable. All take f32 or bf16 (f32 math inside; results and input
// gradients in the input's dtype).
//
// gelu and swiglu also take y_dtype, for mixed precision: bf16 for an f32 input writes y rounded once
// (to nearest even, as every f32 -> bf16 conversion in loom) for the bf16 GEMM that reads it, so that
// GEMM converts nothing and keeps y as its saved operand. The backward is the f32 one: it recomputes
// from the f32 inputs and takes the f32 gradient the GEMM returns. CPU only so far.
#pragma once

#include <optional>

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::ops {

enum class GeluApproximation { None, Tanh };  // exact (erf) or GPT-2's tanh approximation

Tensor silu(const Tensor& x);                                              // x * sigmoid(x)
Tensor gelu(const Tensor& x, GeluApproximation approx = GeluApproximation::None,
           std::optional<DType> y_dtype = {});

// The SwiGLU gate, fused: silu(gate) * up. gate, up: same shape [..., F].
Tensor swiglu(const Tensor& gate, const Tensor& up, std::optional<DType> y_dtype = {});

// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
// Element i is dropped iff random_uniform(key, i) < p, so the mask depends only on (key, i): the same
// whatever the thread count. Identity when !training or p == 0. p must be in [0, 1).
Tensor dropout(const Tensor& x, float p, RngKey key, bool training = true);

}  // namespace loom::ops
