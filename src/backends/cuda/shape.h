// CUDA kernels for the copying shape ops (ops/shape.h: narrow, concat, transpose): the CPU's byte copies
// on device memory, queued on ctx's stream. They move elements of `elem` bytes (1, 2, 4 or 8: every
// dtype) without reading them, so results are the CPU's bit for bit.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

// For each of `outer` rows, copies len * inner elements from src (rows of src_len * inner elements,
// starting at element src_off * inner) to dst (rows of dst_len * inner, starting at dst_off * inner):
// the CPU's copy_rows (narrow forward and backward, concat forward and backward).
void copy_rows(const Context& ctx, const void* src, int64_t src_len, int64_t src_off, void* dst, int64_t dst_len,
               int64_t dst_off, int64_t outer, int64_t len, int64_t inner, size_t elem, const char* op);

// x viewed as [A, n0, M, n1, I] -> out [A, n1, M, n0, I] (dimensions d0 < d1 swapped: A the product of
// the dimensions before d0, M between them, I after d1).
void transpose_copy(const Context& ctx, const void* x, void* out, int64_t A, int64_t n0, int64_t M, int64_t n1,
                    int64_t I, size_t elem);

}  // namespace loom::cuda
