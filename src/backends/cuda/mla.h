// CUDA kernels for multi-head latent attention's head layouts (ops/mla.h): the CPU op's copies and
// cpu::rope_rotate_row (rotate-half pairs x[i], x[i + P/2]) on device memory, queued on ctx's stream.
// The cos/sin tables are built on the host (ops::rope_tables, the CPU's numbers) and copied by the op.
//
// Legend: B batch, T queries, S keys, H heads, N d_nope, P d_rope (even), Dv d_v, D = N + P,
// W = N + Dv. Tables: cos, sin [rows, P/2], row t (shared positions) or b * T + t (per_batch).
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

// Forward: q [B, T, H*D] -> out [B, H, T, D], each head's last P values rotated. Backward (`backward`):
// dout [B, H, T, D] -> dq [B, T, H*D], rotated back (the inverse angle).
void mla_query_heads(const Context& ctx, const float* src, float* dst, const float* cos, const float* sin, int64_t B,
                     int64_t T, int64_t H, int64_t N, int64_t P, bool per_batch, bool backward);

// kv_b [B, S, H*W], k_rope [B, S, P] -> k [B, H, S, D] = [k_nope | rope(k_rope)], v [B, H, S, Dv].
void mla_key_value_heads_forward(const Context& ctx, const float* kv_b, const float* k_rope, const float* cos,
                                 const float* sin, int64_t B, int64_t S, int64_t H, int64_t N, int64_t P, int64_t Dv,
                                 bool per_batch, float* k, float* v);

// dk [B, H, S, D], dv [B, H, S, Dv] -> dkv_b [B, S, H*W], dk_rope [B, S, P]: the heads' rope-key
// gradients summed in head order (as the CPU), then rotated back.
void mla_key_value_heads_backward(const Context& ctx, const float* dk, const float* dv, const float* cos,
                                  const float* sin, int64_t B, int64_t S, int64_t H, int64_t N, int64_t P, int64_t Dv,
                                  bool per_batch, float* dkv_b, float* dk_rope);

}  // namespace loom::cuda
