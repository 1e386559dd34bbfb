// Attention as blocks of cuBLASLt GEMMs with row kernels between them: the f32 entry points of
// attention.h take this path unless LOOM_CUDA_ATTENTION=warp asks for the one-warp-per-row kernels.
//
// Why: the warp kernels run on the CUDA cores at ~1 TFLOP/s (GPT-2 small, T = 1024: 1.0 s of a 1.4 s step
// on an H200), while the GEMMs of a block of query rows run on the tensor cores (bf16 products) or at the
// f32 rate. q, k, v (and dO) are first packed head-major, [B, H, T, D], so that one strided-batched GEMM
// covers every batch entry and every k/v head at once: batch j = b * Hkv + hk, and query head
// n = j * g + r for the group's member r (g = kv_group). Per member r and block of c query rows
// [i0, i0 + c), with j1 the block's last visible key + 1 (causal blocks stop early, so about half the
// square is done):
//
//   forward:  S [B Hkv, c, j1] = Q_n[i0:] K_j^T          (GEMM, raw scores, f32)
//             P = exp2(S scale log2e - lse) Z, lse      (row kernel; Z the dropout factor, 1 without)
//             O_n[i0:] = P V_j                           (GEMM into a packed O, unpacked into out at the end)
//   backward: delta_i = dO_i . O_i                       (row kernel, once)
//             S again; dP = dO_n[i0:] V_j^T              (GEMMs)
//             dS = P (dP Z - delta), PZ = P Z            (row kernel)
//             dQ_n[i0:] = scale dS K_j                   (GEMM into a packed dQ)
//             dK_j += scale dS^T Q_n[i0:], dV_j += PZ^T dO_n[i0:]  (GEMMs into f32 accumulators, in
//                                                        member and block order: the same bits every run)
//
// A call covers as many k/v heads as keep its f32 scores within a budget (256 MiB; the .cu says what
// other choices measured): one call per head (432 launches a layer for GPT-2 small) was bound by host
// time per launch, all heads at once slowed down at batch 64 (0.5 GB of scores a call).
// Memory: the block buffers (the budget, or one head's block if larger), the packed copies and f32
// dK/dV accumulators: linear in T, never [Tq, Tk] for all heads at once.
// bf16_products (mixed precision): q, k, v, dO are packed as bf16 and P, dS rounded to bf16 as they form,
// the CPU's AVX512-BF16 contract (attention_problem.h), so the five products run on the tensor cores
// with f32 accumulation; scores, the softmax, lse, delta and every sum stay f32.
#pragma once

#include "backends/attention_problem.h"
#include "backends/cuda/runtime.h"

namespace loom::cuda {

// False when LOOM_CUDA_ATTENTION=warp (read once).
bool chunked_attention_enabled();

void chunked_attention_forward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                               const float* v, float* out, float* lse);
// Overwrites dq, dk, dv (laid out like q, k, v).
void chunked_attention_backward(const Context& ctx, const AttentionProblem& p, const float* q, const float* k,
                                const float* v, const float* out, const float* dout, const float* lse, float* dq,
                                float* dk, float* dv);

}  // namespace loom::cuda
