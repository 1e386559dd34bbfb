// Multi-head latent attention's head layouts (DeepSeek-V2/V3; models/deepseek_v3/mla.h has the model):
// the per-head queries, keys and values that scaled_dot_product_attention reads, built from the
// projections' outputs in one pass each way, RoPE on the rotated part included. Composed from basic ops
// (split heads, narrow, rope, concat) the same values took four or five copies forward and, backward,
// zero-filled gradients and their sums; these ops give the same values (the same copies, the same
// cpu::rope_rotate_row) without them. f32, on the CPU or CUDA (backends/cuda/mla.h).
//
// Legend: B batch, T queries, S keys, H heads, N d_nope, P d_rope, Dv d_v. RoPE in the rotate-half
// layout (pairs x[i], x[i + P/2]), angles from `cache` at `positions`: i32 [T] (or [S]) shared by the
// batch, or [B, T] per row (packed rows).
#pragma once

#include <utility>

#include "core/tensor.h"
#include "ops/rope.h"

namespace loom::ops {

// q: [B, T, H*(N+P)] (wq_b's output) -> [B, H, T, N+P], each head's last P values rotated.
// Differentiable in q.
Tensor mla_query_heads(const Tensor& q, int64_t H, int64_t N, int64_t P, const Tensor& positions,
                       const RopeCache& cache);

// kv_b: [B, S, H*(N+Dv)] (wkv_b's output), k_rope: [B, S, P] (the shared RoPE key, not yet rotated) ->
//   k [B, H, S, N+P] = [k_nope | rope(k_rope)], the same rotated key in every head, and v [B, H, S, Dv].
// Differentiable in both; k_rope's gradient sums the heads' in head order, then rotates back.
std::pair<Tensor, Tensor> mla_key_value_heads(const Tensor& kv_b, const Tensor& k_rope, int64_t H, int64_t N,
                                              int64_t Dv, const Tensor& positions, const RopeCache& cache);

}  // namespace loom::ops
