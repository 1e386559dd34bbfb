// Attention over a KV cache held in fixed-size blocks (paged, as vLLM's), for batched serving: the rows
// of one step belong to any number of sequences, each row at its own position and reading its own
// sequence's blocks. Inference only (no autodiff); CPU only. Kernel and its ordering guarantees:
// backends/cpu/paged_attention.h (a row's output depends on its own query and its sequence's cache only).
//
// Legend: R rows, H query heads, Hkv k/v heads, D head dim, S block size, NB blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom::ops {

// Where each row of a step sits: its position and its sequence's block table (block ids, position p in
// slot p % S of block table[p / S]). Rows of one sequence share a table.
struct PagedRows {
  std::vector<int64_t> positions;               // [R]
  std::vector<const std::vector<int32_t>*> tables;  // [R], each with at least positions[r] / S + 1 ids
  int64_t size() const { return static_cast<int64_t>(positions.size()); }
};

// Writes k, v [R, Hkv, D] to row r's slot (positions[r]) of the caches k_cache, v_cache [NB, Hkv, S, D].
void paged_kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const PagedRows& rows);
// Writes x [R, Hkv, D] to row r's slot of one cache [NB, Hkv, S, D]: a latent cache, whose slots hold
// a key and, in its first numbers, the value (multi-head latent attention).
void paged_cache_write(Tensor& cache, const Tensor& x, const PagedRows& rows);

// Checks the caches k_cache, v_cache [NB, Hkv, S, D] and the rows as paged_attention does (every block a
// row reads is in the cache; H query heads a multiple of Hkv), naming `op`; returns the rows' block tables'
// data, [R], for a kernel that reads them (the fused paged step, ops/decode_step.h).
std::vector<const int32_t*> paged_row_tables(const char* op, const Tensor& k_cache, const Tensor& v_cache, int64_t H,
                                             const PagedRows& rows);

// The scores' scale (0: 1/sqrt(D)) and the values' width Dv <= D (0: D; a value is the first Dv numbers
// of its slot). Multi-head latent attention passes its latent cache as both k_cache and v_cache, with
// Dv = kv_rank and the scale of its per-head dims.
struct PagedAttentionOptions {
  float scale = 0;
  int64_t value_dim = 0;
};

// q: [R, H, D] (rotated). Row r attends to positions 0..positions[r] of its sequence, keys and values
// already written. Returns [R, H, Dv].
Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const PagedRows& rows,
                       const PagedAttentionOptions& options = {});

}  // namespace loom::ops
