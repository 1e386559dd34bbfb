// Losses, differentiable in the logits.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// Mean cross-entropy of logits [..., V] against targets i32 [...] (same leading shape), computed with
// a stable log-sum-exp. Positions whose target equals ignore_index count neither in the sum nor in the
// mean's denominator. Returns a scalar []. A target outside [0, V) that is not ignore_index is an error.
// Fused: the backward is softmax(logits) - onehot(target), scaled by 1/count.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -100);

}  // namespace loom::ops
