// CUDA kernels for the token embedding: the contracts of backends/cpu/embedding.h on device memory,
// queued on ctx's stream. Legend: N tokens, V vocab rows, C channels per row.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

// The index of the first id outside [0, V), -1 when all are valid,
// and the number of ids that are not `ignore_index`. Reads the answer back to the host, so it waits for
// the stream; inside a CUDA graph capture (where nothing may be read back) it returns {-1, -1} without
// checking: the kernels below never read or write outside the table for a bad id (they skip it), so an
// unchecked bad id gives a wrong result, never a fault.
struct IdScan {
  int64_t first_bad = -1;  // flat index of the first bad id, -1 if none (or unchecked)
  int32_t bad_value = 0;   // its value
  int64_t count = -1;      // ids != ignore_index (-1 when unchecked)
};
// Ids equal to ignore_index are neither bad nor counted (pass INT64_MIN to count and check every id).
IdScan scan_ids(const Context& ctx, const int32_t* ids, int64_t N, int64_t V, int64_t ignore_index, const char* op);

// out[n, :] = table[ids[n], :]; elem_bytes 4 (f32) or 2 (bf16). A bad id gives a zero row.
void embedding_forward(const Context& ctx, void* out, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t elem_bytes);

// d_table[V,C] = 0, then d_table[ids[n], :] += d_out[n, :] for n in order: the tokens are sorted by id
// (a stable radix sort) and one block per id sums its tokens' rows in token order, so every element is
// summed in the CPU's order (bitwise equal to it), with no atomics. Bad ids are skipped.
void embedding_backward(const Context& ctx, float* d_table, const int32_t* ids, const float* d_out, int64_t N,
                        int64_t V, int64_t C);

}  // namespace loom::cuda
