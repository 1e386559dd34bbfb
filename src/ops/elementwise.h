// Element-wise arithmetic and reductions to a scalar, differentiable. Shapes must match exactly (no
// broadcasting: the fused ops that need a broadcast do it inside their kernels).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

Tensor add(const Tensor& a, const Tensor& b);   // a + b
Tensor sub(const Tensor& a, const Tensor& b);   // a - b
Tensor mul(const Tensor& a, const Tensor& b);   // a * b
Tensor scale(const Tensor& a, float s);         // a * s
Tensor sum(const Tensor& a);                    // scalar [] sum of all elements
Tensor mean(const Tensor& a);                   // scalar [] mean of all elements

// In place, never recorded: dst += src (used by the autodiff engine and optimizers).
void add_(Tensor& dst, const Tensor& src);
// In place, never recorded: a *= s (gradient clipping, averaging gradients over ranks).
void scale_(Tensor& a, float s);
// In place, never recorded: dst (bf16) = src (f32) rounded to nearest even, same shape and device: a
// mixed-precision weight's bf16 copy, refilled without allocating (Tensor::to allocates).
void convert_(Tensor& dst, const Tensor& src);

}  // namespace loom::ops
