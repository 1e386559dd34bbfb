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

#include "backends/attention_problem.h"

namespace loom::cpu {

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
