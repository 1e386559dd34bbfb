// Token embedding lookup, differentiable in the table (scatter-add backward).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// ids: i32 [...], each in [0, V); table: [V, C]. Returns [..., C]. An id out of range is an error that
// names it. Backward: d_table[id] += d_out[...] (rows hit by several tokens sum, in a fixed order).
Tensor embedding(const Tensor& ids, const Tensor& table);

}  // namespace loom::ops
