// Token embedding lookup, differentiable in the table (scatter-add backward).
#pragma once

#include "core/tensor.h"
#include "quant/qmatmul.h"

namespace loom::ops {

// ids: i32 [...], each in [0, V); table: [V, C]. Returns [..., C]. An id out of range is an error that
// names it. Backward: d_table[id] += d_out[...] (rows hit by several tokens sum, in a fixed order).
Tensor embedding(const Tensor& ids, const Tensor& table);

// The lookup from a table held in a GGUF block format (QLoRA's frozen embedding): each id's row is
// dequantized from its blocks, so the table never exists in f32. Not differentiable (the table is
// frozen; nothing before it trains). ids: i32 [...] in [0, V) (an id out of range names it); table [V, C].
// Returns f32 [..., C]: the rows of the table dequantized whole, bit for bit.
Tensor dequantized_embedding(const Tensor& ids, const quant::QuantizedMatrix& table);

}  // namespace loom::ops
