// CPU kernels for the mixture-of-experts ops (ops/moe.h): sigmoid top-k routing, the sparse routed
// experts (dispatch, per-expert SwiGLU GEMMs, combine) and the sequence-wise balance loss.
//
// Legend: N tokens, C d_model, E routed experts, K experts per token, F d_expert, P = N*K routed slots
// (slot s = n*K + k is token n's k-th choice), B batch, T sequence.
//
// Dispatch layout. A counting sort by expert orders the P slots so that each expert's slots are one
// contiguous run of "rows": expert e owns rows [offsets[e], offsets[e+1]), and within a run the slots
// keep their order (token-major), so the layout depends only on expert_index. Row p holds slot
// slot_of_row[p]; slot s sits at row row_of_slot[s].
//
// Work split and determinism. Each GEMM of the layer is one grouped GEMM over all experts (cpu/gemm.h,
// gemm_grouped): expert e is the group of rows [offsets[e], offsets[e+1]), x's and dy's rows gathered
// by token_of_row while the kernel packs them (no gathered copy of x), each expert's weights packed
// once and read by all its row blocks. The forward runs h1 = x w1^T and h3 = x w3^T, the SwiGLU over
// all rows, then a w2^T; the backward dau = dy w2, one elementwise pass (dh1, dh3, g a, the gate
// gradients), dxp = dh1 w1 + dh3 w3, and the weight gradients with each expert's rows as the reduction.
// The grouped GEMM gives the same bits for any thread count, the elementwise passes work row by row,
// and combining (y, dx) sums a token's K slots in k order: every result is bitwise the same whatever
// the thread count.
//
// Operand dtype T (float or bf16): the GEMM operands (x, weights, and in the backward dy and the SwiGLU
// gradients); accumulation, outputs and saved activations are f32. bf16 is the mixed precision of
// ops::linear's MatmulPrecision::BF16: operands rounded once to bf16, f32 products and sums.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/moe_dispatch.h"
#include "core/dtype.h"

namespace loom::cpu {

// ---- routing -------------------------------------------------------------------------------------

// affinity = sigmoid(logits) (f32); index[n, :] = the K experts with the largest affinity + bias, in
// descending order, a tie going to the lower expert index (a NaN score ranks below every number);
// gates[n,k] = affinity[n, index[n,k]] / sum_k' affinity[n, index[n,k']] * route_scale (the sum in k order);
// load[e] = number of slots routed to e. logits: [N,E] (float or bf16); bias: [E].
template <typename T>
void moe_route_forward(const T* logits, const float* bias, int64_t N, int64_t E, int64_t K, float route_scale,
                       int32_t* index, float* gates, float* affinity, int32_t* load);

// dlogits[n,e] = s(1-s) * (daffinity[n,e] + [e chosen] * route_scale/S * (dgates[n,k] - sum_k' dgates[n,k']
// * s[n,k'] / S)), s = affinity, S = sum of the chosen affinities. Overwrites dlogits; a null dgates or
// daffinity counts as zeros.
template <typename T>
void moe_route_backward(T* dlogits, const float* dgates, const float* daffinity, const float* affinity,
                        const int32_t* index, int64_t N, int64_t E, int64_t K, float route_scale);

// ---- routed experts ------------------------------------------------------------------------------

// y[n] = sum_k gates[n,k] * w2[e] (silu(w1[e] x[n]) * (w3[e] x[n])), e = expert_index[n,k].
// x: [N,C]; gates: [N,K]; w1, w3: [E,F,C]; w2: [E,C,F]; y: [N,C] (overwritten).
// h1, h3: [P,F] in row order, the pre-activations w1 x and w3 x, written when not null (what the
// backward needs; nothing else is saved).
template <typename T>
void moe_experts_forward(const MoeDispatch& d, const T* x, const float* gates, const T* w1, const T* w3,
                         const T* w2, int64_t C, int64_t F, float* y, float* h1, float* h3);

// Gradients of sum(y * dy) for the forward above, from the saved h1, h3. Each output is optional
// (null: not computed) and overwritten: dx [N,C], dgates [N,K], dw1, dw3 [E,F,C], dw2 [E,C,F] (f32).
// dy: [N,C] f32 (rounded to T for the GEMMs).
template <typename T>
void moe_experts_backward(const MoeDispatch& d, const float* dy, const T* x, const float* gates, const T* w1,
                          const T* w3, const T* w2, const float* h1, const float* h3, int64_t C, int64_t F,
                          float* dx, float* dgates, float* dw1, float* dw3, float* dw2);

// The dense oracle: every expert on every token, gates scattered to [N,E] (zero where unchosen), in
// double. For the tests only: O(N*E*F*C).
void moe_experts_forward_reference(const float* x, const int32_t* expert_index, const float* gates,
                                   const float* w1, const float* w3, const float* w2, int64_t N, int64_t C,
                                   int64_t F, int64_t E, int64_t K, float* y);

// ---- sequence-wise balance loss ------------------------------------------------------------------

// loss = alpha / B * sum_b sum_e f[b,e] P[b,e] with f[b,e] = E/(K*T) * #{t : e in index[b,t,:]} and
// P[b,e] = mean_t affinity[b,t,e] / sum_j affinity[b,t,j]. f: [B,E] is written (the backward needs it).
float moe_balance_loss_forward(const float* affinity, const int32_t* index, int64_t B, int64_t T, int64_t E,
                               int64_t K, float alpha, float* f);

// daffinity[b,t,j] = dloss * alpha/(B*T) * (f[b,j] - sum_i f[b,i] s[b,t,i] / S) / S, S = sum_i s[b,t,i].
void moe_balance_loss_backward(float* daffinity, float dloss, const float* affinity, const float* f, int64_t B,
                               int64_t T, int64_t E, float alpha);

}  // namespace loom::cpu
