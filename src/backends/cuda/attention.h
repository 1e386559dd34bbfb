// CUDA flash attention: the contract of cpu::flash_attention_{forward,backward} (backends/attention_problem.h:
// the same AttentionProblem, layouts, causal rule, grouped-query heads, dropout counter and lse
// convention), on device memory, queued on ctx's stream. What differs:
//   * RoPE is not fused: p.rope.cos must be null (the op rotates q and k with cuda::rope_apply first, and
//     dq, dk back afterwards).
//   * q, k, v, out, dout, dq, dk, dv may be f32 or bf16 (all the same type); scores, the softmax and every
//     accumulator are f32; lse is f32.
//   * f32 tensors go through blocks of cuBLASLt GEMMs (attention_chunked.h), which honour bf16_products;
//     LOOM_CUDA_ATTENTION=warp, and bf16 tensors, take the warp kernels below.
//   * D and Dv must be at most 256.
//
// The warp kernels (FlashAttention-2's algorithm, kept simple; 1 TFLOP/s on an H200):
//   forward: one warp per query row, keys in tiles staged in shared memory by the block's warps, an online
//            softmax in the log2 domain; lse [N, Tq] = the row's log2-sum-exp2 of scores*scale*log2(e).
//   backward: delta_i = dout_i . out_i; dq by one warp per query row over the keys; dk, dv by one warp per
//            key row over the query rows of every query head of its group, in order. No atomics: the
//            results are the same bits every run.
// Memory: O((Tq + Tk) * D) beyond the inputs (delta, [N, Tq]), never [Tq, Tk].
#pragma once

#include <cstdint>

#include "backends/attention_problem.h"
#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

void flash_attention_forward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                             const float* v, float* out, float* lse);
void flash_attention_forward(const Context& ctx, const AttentionProblem& p, const bf16* q, const bf16* k,
                             const bf16* v, bf16* out, float* lse);
// Overwrites dq, dk, dv (laid out like q, k, v).
void flash_attention_backward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                              const float* v, const float* out, const float* dout, const float* lse, float* dq,
                              float* dk, float* dv);
void flash_attention_backward(const Context& ctx, const AttentionProblem& p, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const bf16* dout, const float* lse, bf16* dq, bf16* dk,
                              bf16* dv);

}  // namespace loom::cuda
