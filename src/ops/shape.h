// Shape changes that are differentiable. All tensors are contiguous, so reshape is a view.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// Same data, new shape (same numel). One dimension may be -1 and is inferred.
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);

}  // namespace loom::ops
