// Mixture-of-experts ops for the DeepSeek-V3 family: sigmoid routing with a selection-only bias,
// sparse expert compute (tokens grouped by expert, each expert's GEMMs on its own tokens only) and
// DeepSeek's sequence-wise balance loss.
//
// Legend: N tokens (B*T), C d_model, E routed experts, K experts per token (top_k), F d_expert.
// Kernels: backends/cpu/moe.*; the design (dispatch layout, backward, determinism, what is saved, speed):
// docs/moe.md. Every result is bitwise the same for any thread count.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/matmul.h"

namespace loom::ops {

struct MoeRouting {
  Tensor expert_index;  // i32 [N, K]: chosen experts, by descending affinity + bias; ties -> lower index
  Tensor gates;         // f32 [N, K]: affinity of each chosen expert / sum over the chosen * route_scale;
                        //   differentiable w.r.t. the router logits (through the affinities)
  Tensor affinity;      // f32 [N, E]: sigmoid(logits), differentiable (the balance loss uses it)
  Tensor expert_load;   // i32 [E], no gradient: token slots routed to each expert (sums to N*K)
};

// logits: [N, E] (f32 or bf16; the sigmoid and everything after it are computed in f32).
// bias: f32 [E], model state (not a parameter): it decides which experts are picked, never the gate
// values, and gets no gradient. Must be finite. On the CPU or on the logits' device. A NaN logit ranks below every number (never picked
// while a finite choice is left); its NaN then reaches the loss instead of an arbitrary pick.
// top_k in [1, E]; route_scale finite and > 0. Recorded for autodiff: gates and affinity (the logits'
// gradient is bf16 for bf16 logits).
MoeRouting moe_route(const Tensor& logits, const Tensor& bias, int64_t top_k, float route_scale);

// The routed experts, sparse:
//   y[n] = sum_k gates[n,k] * w2[e] (silu(w1[e] x[n]) * (w3[e] x[n])),  e = expert_index[n,k].
// Tokens are permuted so each expert's rows are contiguous, each expert runs its GEMMs on its own rows
// only, and the results are combined with the gates; the backward runs the same way.
// Differentiable w.r.t. x, gates, w1, w3, w2.
// x: [N, C]; expert_index: i32 [N, K]; gates: f32 [N, K]; w1, w3: [E, F, C]; w2: [E, C, F] -> [N, C]
// (x's dtype; precision as for ops::linear).
// dtypes: x and the weights f32 (precision F32, or BF16: bf16 GEMM operands, f32 accumulation and
// result, f32 gradients), or all bf16 for inference only (recording through bf16 tensors is refused).
// expert_index values must be in [0, E) (checked); an expert may get no token (its weight gradients are
// zero). Saved for backward: the inputs (bf16 copies under BF16) and w1 x, w3 x: 2 * N*K*F floats.
Tensor moe_experts(const Tensor& x, const Tensor& expert_index, const Tensor& gates, const Tensor& w1,
                   const Tensor& w3, const Tensor& w2, MatmulPrecision precision = MatmulPrecision::F32);

// DeepSeek's complementary sequence-wise balance loss, as in the seed:
//   f[b,i] = E / (K*T) * (tokens of sequence b that picked expert i)
//   P[b,i] = mean over t of affinity[b,t,i] / sum_j affinity[b,t,j]
//   loss   = alpha * mean over b of sum_i f[b,i] * P[b,i]      (a scalar f32; gradient through P only)
// routing from moe_route over N = batch*seq tokens in [B, T] order.
Tensor moe_sequence_balance_loss(const MoeRouting& routing, int64_t batch, int64_t seq, float alpha);

// Aux-loss-free balancing, the seed's update_bias, applied in place after an optimizer step (not a
// gradient, not recorded): bias[e] += gamma * sign(mean_j load[j] - load[e]). expert_load: i32 [E]
// slot counts (moe_route's, or their sum over micro-batches); the comparison is exact (integers), so an
// expert at exactly the mean load keeps its bias. Load shares for metrics: expert_load / (N*K).
void moe_update_bias_(Tensor& bias, const Tensor& expert_load, float gamma);

}  // namespace loom::ops
