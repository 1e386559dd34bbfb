// CUDA kernel for rotary position embedding: the contract of backends/cpu/rope.h (rope_apply) on device
// memory, queued on ctx's stream. The cos/sin tables are built on the host by cpu::rope_tables (double
// precision, the same numbers as the CPU path) and copied to the device by the op.
//
// Legend: D head dimension (even), rows = x viewed as [rows, D], t the sequence length.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

// out, x: [rows, D] (out may equal x); cos, sin: [P, D/2] on the device. Row r uses table row
// (per_row_positions ? r : r % t); `inverse` rotates by the negative angle (the backward).
// Row r may also be split into `heads` consecutive head vectors of D that share the row's position
// (x viewed as [rows, heads, D], as the [B, T, H*D] projections are): pass heads = 1 otherwise.
void rope_apply(const Context& ctx, float* out, const float* x, const float* cos, const float* sin, int64_t rows,
                int64_t t, int64_t d, bool per_row_positions, bool interleaved, bool inverse, int64_t heads = 1);

}  // namespace loom::cuda
