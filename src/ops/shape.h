// Shape changes that are differentiable. All tensors are contiguous, so reshape is a view.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// Same data, new shape (same numel). One dimension may be -1 and is inferred.
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);

}  // namespace loom::ops

namespace loom::ops {

// Swaps dimensions d0 and d1 (negative counts from the end), copying into a new contiguous tensor.
// E.g. [B, T, H, D] -> [B, H, T, D] with transpose(x, 1, 2). Any dtype.
Tensor transpose(const Tensor& x, int d0, int d1);

// Joins tensors along `dim`; all other dimensions must match. Differentiable.
Tensor concat(const TensorList& xs, int dim);

// Entries [start, start + length) of dimension `dim`, copied into a new contiguous tensor (concat's
// inverse: e.g. the nope and rope parts of MLA's per-head queries). Any dtype; differentiable for f32,
// the backward writing the gradient into that range of a zero tensor.
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);

}  // namespace loom::ops
