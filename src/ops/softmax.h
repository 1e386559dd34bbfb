// Numerically stable softmax (max-subtracted), differentiable.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// softmax over dimension `dim` (negative counts from the end). Any shape.
Tensor softmax(const Tensor& x, int dim = -1);

}  // namespace loom::ops
