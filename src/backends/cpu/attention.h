// CPU kernels for scaled dot-product attention.
//
// Legend: B batch, H heads per batch entry, N = B*H independent attention problems ("heads"),
// Tq/Tk query/key lengths, D q/k head dimension, Dv value head dimension.
//
// Two implementations, kept side by side:
//   * flash_attention_{forward,backward}: FlashAttention-2 style. Queries are processed in blocks of
//     rows, keys in blocks of columns, with an online softmax; the forward saves one logsumexp per
//     query row and the backward recomputes the probabilities blockwise from it. Scratch memory is
//     O((Tq + Tk) * D) per thread: no Tq x Tk matrix ever exists. Supports a causal rule and fused
//     RoPE on q and k, so the model's head split + RoPE + attention + head merge is one pass.
//   * masked_attention_{forward,backward}: the naive algorithm (materialises each head's [Tq, Tk]
//     scores, double accumulation) with an arbitrary boolean mask. It is the path for explicit masks
//     and the oracle the flash kernels are tested against.
//
// Both parallelise over heads; each head is computed by one thread in a fixed order, so results are
// bitwise identical whatever the thread count (dK/dV accumulate over query blocks, and with grouped-query
// attention over the query heads of a group, inside one thread).
// Rows whose mask/causal rule allows no key produce zeros, and zero gradients.
//
// Dropout on the probabilities (flash kernels only): see AttentionProblem::dropout_p. The keep mask is
// drawn from the counter RNG at attention_dropout_counter(n, i, j), a function of the element alone, so
// it does not depend on threads or block sizes, and the backward redraws exactly the forward's mask
// instead of storing a [Tq, Tk] one.
#pragma once

#include <cstdint>

#include "core/rng.h"

namespace loom::cpu {

// Where an operand's rows live: head n = b * heads_per_batch + h has row t at
//   base + b * batch_stride + h * head_stride + t * row_stride   (elements are contiguous in a row).
// [N, T, D] tensors: {T*D, 0, D} with heads_per_batch = 1. [B, T, H*D] projections: {T*H*D, D, H*D}.
struct HeadLayout {
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
};

// Optional RoPE applied to q and k rows before attention (and its inverse to dq, dk).
struct RopeTables {
  const float* cos = nullptr;  // [P, D/2]; row for (b, t) is b * batch_stride + t
  const float* sin = nullptr;
  int64_t batch_stride = 0;    // 0 when positions are shared by the batch ([T]), T for [B, T]
  bool interleaved = true;
};

struct AttentionProblem {
  int64_t batches = 1;
  int64_t heads_per_batch = 1;
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;  // query i sees keys j <= i + (tk - tq)
  // Grouped-query attention: query heads h of one batch entry read k/v head h / kv_group, so k and v
  // have heads_per_batch / kv_group heads (1 = ordinary multi-head attention). dk/dv sum over a group.
  int64_t kv_group = 1;
  HeadLayout q, k, v, out;  // gradients use the layout of the tensor they belong to
  RopeTables rope;          // flash kernels only; cos == nullptr means no RoPE
  // Inverted dropout on the probabilities, as F.dropout(softmax(S), p) (flash kernels only): out_i =
  // sum_j Z_ij P_ij v_j with Z_ij = keep(n, i, j) / (1 - p), P the softmax normalised WITHOUT dropout,
  // keep(n, i, j) = !(random_uniform(dropout_key, attention_dropout_counter(*this, n, i, j)) < p).
  // 0 = no dropout: the kernels then take exactly the code path they take without it.
  float dropout_p = 0.0f;
  RngKey dropout_key;
  // bf16 products (mixed precision, as SDPA under torch.autocast(bfloat16) and FlashAttention-2's bf16
  // kernels): the flash kernels round the operands of their five products (q, k, v, dO as they are
  // packed; P and dS as they form) to bf16, nearest even, and multiply them with f32 accumulation by
  // `vdpbf16ps`. Scores, the online softmax, lse, D_i and dS themselves stay f32, as do inputs and outputs.
  // Only the AVX-512 copy on a CPU with AVX512-BF16 has these products (flash_attention_uses_bf16); the
  // other CPU copies (no bf16 unit to gain speed from) and the masked kernels compute in f32 as without
  // the flag, and CUDA ignores it (its kernels take bf16 tensors for that).
  bool bf16_products = false;

  int64_t heads() const { return batches * heads_per_batch; }
  int64_t kv_heads() const { return heads() / kv_group; }
};

// The dropout stream's counter for head n, query row i, key j: row-major over [N, Tq, Tk64], Tk64 = Tk
// rounded up to a multiple of 64. The padding puts every row's first draw on a 64-word Philox tile
// (philox.h), so the kernels draw whole tiles and none is wasted on a neighbouring row.
inline uint64_t attention_dropout_counter(const AttentionProblem& p, int64_t n, int64_t i, int64_t j) {
  const int64_t tk64 = (p.tk + 63) / 64 * 64;
  return static_cast<uint64_t>(n * p.tq + i) * static_cast<uint64_t>(tk64) + static_cast<uint64_t>(j);
}

// Whether flash_attention_{forward,backward} take bf16 products for p on this CPU and the kernel copy
// cpu_isa() names now: p.bf16_products, the AVX-512 copy, and AVX512-BF16.
bool flash_attention_uses_bf16(const AttentionProblem& p);

// out: rows of Dv per the out layout (with dropout, the dropped output: the backward needs that one).
// lse: [N, Tq], the per-row log2-sum-exp2 of the scores scaled by scale*log2(e) (+inf for a row that sees
// no key; never affected by dropout): an opaque residual for flash_attention_backward.
void flash_attention_forward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                             float* out, float* lse);
// Overwrites dq, dk, dv (laid out like q, k, v).
void flash_attention_backward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                              const float* out, const float* dout, const float* lse, float* dq, float* dk,
                              float* dv);

// mask: bool, may be null; head n's row i is at mask + n * mask_head_stride + i * tk (stride 0
// broadcasts one [Tq, Tk] mask). Combined with p.causal when both are given. lse: [N, Tq], natural log.
void masked_attention_forward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                              const float* q, const float* k, const float* v, float* out, float* lse);
void masked_attention_backward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                               const float* q, const float* k, const float* v, const float* dout,
                               const float* lse, float* dq, float* dk, float* dv);

}  // namespace loom::cpu
