// The inference path for layers whose weight is held quantized (GGUF import): nn::Linear calls this
// when it has a quantized weight. No autodiff: quantized weights have no gradient to give, and a
// backward pass through them is refused up front, naming the layer.
#pragma once

#include <string>

#include "core/tensor.h"
#include "quant/qmatmul.h"

namespace loom::quant {

// y = x W^T (+ bias). x: f32 [..., in]; w: [out, in]; bias: f32 [out] or undefined. Returns f32 [..., out].
// `name` (the layer's weight name) is used in errors. Refused while autodiff is recording and x
// requires a gradient.
Tensor quantized_linear(const Tensor& x, const QuantizedMatrix& w, const Tensor& bias, const std::string& name);

}  // namespace loom::quant
