// Numerically stable softmax (max-subtracted), differentiable.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// softmax over dimension `dim` (negative counts from the end). Any shape. A slice that is entirely
// -inf gives zeros (PyTorch gives NaN): "attend to nothing" stays finite.
Tensor softmax(const Tensor& x, int dim = -1);

}  // namespace loom::ops
