// Normalisations over the last dimension, differentiable. Legend: C the normalised (model) dimension.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// x: [..., C]; weight: [C]. y = x / sqrt(mean(x^2) + eps) * weight.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-5f);

// x: [..., C]; weight, bias: [C] (bias may be undefined). y = (x - mean) / sqrt(var + eps) * weight + bias,
// with the biased variance, as PyTorch's LayerNorm.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);

}  // namespace loom::ops
