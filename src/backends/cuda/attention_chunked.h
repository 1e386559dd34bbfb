// Attention as blocks of cuBLASLt GEMMs with row kernels between them: the f32 entry points of
// attention.h take this path unless LOOM_CUDA_ATTENTION=warp asks for the one-warp-per-row kernels.
//
// Why: the warp kernels run on the CUDA cores at ~1 TFLOP/s (GPT-2 small, T = 1024: 1.0 s of a 1.4 s step
// on an H200), while the GEMMs of a block of query rows run on the tensor cores (bf16 products) or at the
// f32 rate. Per query head h and block of c query rows [i0, i0 + c), batched over the B batch entries,
// with j1 the block's last visible key + 1 (causal blocks stop early, so about half the square is done):
//
//   forward:  S [B, c, j1] = Q_h[i0:] K_g^T             (GEMM, raw scores, f32)
//             P = exp2(S scale log2e - lse) Z, lse      (row kernel; Z the dropout factor, 1 without)
//             O_h[i0:] = P V_g                           (GEMM, written in place in out's layout)
//   backward: delta_i = dO_i . O_i                       (row kernel, once)
//             S again; dP [B, c, j1] = dO_h[i0:] V_g^T   (GEMMs)
//             dS = P (dP Z - delta), PZ = P Z            (row kernel)
//             dQ_h[i0:] = scale dS K_g                   (GEMM, in place)
//             dK_g += scale dS^T Q_h[i0:], dV_g += PZ^T dO_h[i0:]  (GEMMs into f32 accumulators, in head
//                                                        and block order: the same bits every run)
//
// Memory: the block buffers, B * c * Tk floats (c shrinks so they stay under 256 MiB), plus f32 dK/dV
// accumulators: linear in T, never [Tq, Tk] for all heads at once.
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
