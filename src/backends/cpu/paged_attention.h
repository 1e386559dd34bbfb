// Attention of single rows over a paged KV cache: the kernel of ops::paged_attention (serving).
//
// Legend: R rows (tokens of any number of sequences, each at its own position), H query heads, Hkv k/v
// heads (H a multiple of Hkv: query head h reads k/v head h / (H / Hkv)), D head dim, S block size
// (positions per block), NB blocks in the cache.
//
//   q:      [R, H, D] f32, RoPE already applied
//   caches: k, v [NB, Hkv, S, D] f32; position p of a sequence is slot p % S of block table[p / S]
//   out:    [R, H, Dv] f32, Dv = D unless the problem says (a value is the first Dv numbers of its slot)
//
// Multi-head latent attention (DeepSeek-V3, absorbed) is the case Hkv = 1 with k and v the same cache:
// a slot holds [c | k_rope], the key is all of it and the value its first Dv = kv_rank numbers, and the
// scale 1/sqrt(d_nope + d_rope) is not 1/sqrt(D).
//
// Row r at position P attends to positions 0..P of its own sequence (causal; its own key and value are
// in the cache already). Each (row, head) is computed on one thread, in one fixed order: the scores
// q.k_j * scale (default 1/sqrt(D)) by fixed_dot::dot for j = 0..P, their maximum, e_j = exp(s_j - max) summed in j order
// in double, out = (sum_j e_j v_j) / sum accumulated in j order. A row's output therefore depends on its
// query and its sequence's cached keys and values only: not on the other rows, their number or order,
// the thread count, or how the sequence's prompt was cut into chunks.
#pragma once

#include <cstdint>

namespace loom::cpu {

struct PagedAttentionProblem {
  int64_t R = 0, H = 0, Hkv = 0, D = 0, S = 0, NB = 0;
  int64_t Dv = 0;     // value dims, <= D; 0: D
  float scale = 0;    // the scores' scale; 0: 1/sqrt(D)
  int64_t value_dim() const { return Dv > 0 ? Dv : D; }
  const int64_t* positions = nullptr;     // [R]
  const int32_t* const* tables = nullptr;  // [R] pointers to each row's block table (>= positions[r] / S + 1 ids)
};

void paged_attention_forward(const PagedAttentionProblem& p, const float* q, const float* k_cache,
                             const float* v_cache, float* out);
// Query heads [h0, h1) of row r, on the calling thread: out[r, h] from q[r, h], each head by the order
// above, up to kHeadsTogether heads of one k/v head computed side by side (their chains overlap, each
// key and value is loaded once for them). scores: scratch of kHeadsTogether * (positions[r] + 1) floats;
// acc: kHeadsTogether * value_dim() floats. paged_attention_forward is this over every row's heads, so
// a caller running its own team of threads (the fused paged step, decode_step.h) gets its bits.
inline constexpr int64_t kHeadsTogether = 4;
void paged_attention_heads(const PagedAttentionProblem& p, int64_t r, int64_t h0, int64_t h1, const float* q,
                           const float* k_cache, const float* v_cache, float* out, float* scores, float* acc);
// Asks for the first block of the keys row r's head h reads, a head or two ahead of computing it (the
// kernel asks for each later block itself as it goes).
void paged_attention_prefetch(const PagedAttentionProblem& p, int64_t r, int64_t h, const float* k_cache);

// The offset of (block, kv head g, slot) in a [NB, Hkv, S, D] cache.
inline int64_t paged_slot_offset(const PagedAttentionProblem& p, int32_t block, int64_t g, int64_t slot) {
  return ((static_cast<int64_t>(block) * p.Hkv + g) * p.S + slot) * p.D;
}
// Where row r's key or value of kv head g goes: the slot of its position in its sequence's block.
inline int64_t paged_row_offset(const PagedAttentionProblem& p, int64_t r, int64_t g) {
  const int64_t pos = p.positions[r];
  return paged_slot_offset(p, p.tables[r][pos / p.S], g, pos % p.S);
}
// Copies k, v [R, Hkv, D] to each row's slot in the caches.
void paged_kv_write(const PagedAttentionProblem& p, const float* k, const float* v, float* k_cache, float* v_cache);
// Copies x [R, Hkv, D] to each row's slot in one cache (a latent cache: keys and values in one slot).
void paged_row_write(const PagedAttentionProblem& p, const float* x, float* cache);

}  // namespace loom::cpu
