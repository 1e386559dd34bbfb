// CPU kernels for the token embedding. Legend: N tokens (all leading dims flattened), V vocab rows,
// C channels per row.
#pragma once

#include <cstdint>

namespace loom::cpu {

// Index of the first id outside [0, V), or -1 when all are valid.
int64_t embedding_first_bad_id(const int32_t* ids, int64_t N, int64_t V);

// out[n, :] = table[ids[n], :]. elem_bytes: 4 (f32) or 2 (bf16); the copy is dtype-agnostic.
// out: [N,C], table: [V,C]; ids must be valid.
void embedding_forward(void* out, const int32_t* ids, const void* table, int64_t N, int64_t C,
                       int64_t elem_bytes);

// d_table[V,C] = 0, then d_table[ids[n], :] += d_out[n, :] for n in order. Columns are split into fixed
// chunks across threads (each chunk walks all tokens in order), so every row's sum has the same order
// whatever the thread count: deterministic, no atomics.
void embedding_backward(float* d_table, const int32_t* ids, const float* d_out, int64_t N, int64_t V,
                        int64_t C);

}  // namespace loom::cpu
