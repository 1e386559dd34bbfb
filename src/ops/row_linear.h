// y = x W^T with every row of y computed from its own row of x by one fixed arithmetic, whatever the
// number of rows: the linear layers of batched serving (nn/paged_decoder.h), where a request's logits
// must not depend on which other requests share its decode step. ops::linear goes through a GEMM
// library, which may change its kernel, and the order of its sums, with M. Inference only (no autodiff).
// Kernel: backends/cpu/row_linear.h (CPU only).
//
// Legend: M rows, K in features, N out features.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// x: f32 [M, K]; w: f32 [N, K] (out, in). Returns f32 [M, N].
Tensor row_linear(const Tensor& x, const Tensor& w);

}  // namespace loom::ops
