// Normalisations over the last dimension, differentiable. Legend: C the normalised (model) dimension.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace loom::ops {

// x: [..., C] (f32 or bf16; y has its dtype); weight: [C] f32. y = x / sqrt(mean(x^2) + eps) * weight.
// y_dtype: x's by default; bf16 for an f32 x is mixed precision: y is rounded once, in the norm's own
// pass, for the bf16 GEMMs that read it (ops::linear under MatmulPrecision::BF16 then converts nothing),
// and the backward is the f32 one (it takes the f32 gradient those GEMMs return, and gives an f32 dx).
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-5f, std::optional<DType> y_dtype = {});

// The pre-norm residual step, fused (DESIGN.md: fuse what sits between GEMMs):
//   sum = x + residual;  normed = rms_norm(sum, weight, eps).
// x, residual: [..., C], same shape and dtype (f32 or bf16); weight: [C] f32. `sum` is the new residual
// stream. Same values as ops::add then ops::rms_norm, with one pass over memory each way: forward reads
// x and residual and writes sum and normed (4 tensors instead of 5), and the backward writes the shared
// gradient of x and residual, d(sum) + d(norm), in the norm's own pass.
struct AddRmsNorm {
  Tensor sum;     // [..., C]
  Tensor normed;  // [..., C]
};
// normed_dtype: as rms_norm's y_dtype (sum keeps x's dtype).
AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps = 1e-5f,
                        std::optional<DType> normed_dtype = {});

// x: [..., C] (f32 or bf16; y has its dtype); weight, bias: [C] f32 (bias may be undefined).
// y = (x - mean) / sqrt(var + eps) * weight + bias,
// with the biased variance, as PyTorch's LayerNorm.
// y_dtype: as rms_norm's.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f,
                  std::optional<DType> y_dtype = {});

}  // namespace loom::ops
