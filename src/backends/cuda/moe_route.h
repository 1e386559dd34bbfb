// CUDA kernels for DeepSeek-V3's MoE routing, its sequence-wise balance loss and the aux-loss-free bias
// update: the contracts of cpu::moe_route_{forward,backward} and cpu::moe_balance_loss_{forward,backward}
// (backends/cpu/moe.h) and of ops::moe_update_bias_ on device memory, queued on ctx's stream.
//
// Legend: N tokens, E routed experts, K experts per token, B sequences of T tokens (N = B*T).
// Every sum runs in the CPU's order (one thread per token or per (sequence, expert) walking its values
// sequentially, products and sums rounded as written, no FMA contraction); the expert loads are integer
// counts (integer atomics: exact, so order-free). The one difference left: the sigmoid's expf may differ
// from the host's exp by an ulp, so affinities and gates match the CPU to ~1e-7, not bit for bit.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

// logits [N, E] (float or bf16), bias [E] -> index i32 [N, K], gates [N, K], affinity [N, E], load i32 [E].
template <typename T>
void moe_route_forward(const Context& ctx, const T* logits, const float* bias, int64_t N, int64_t E, int64_t K,
                       float route_scale, int32_t* index, float* gates, float* affinity, int32_t* load);

// dlogits [N, E] (float or bf16) from dgates [N, K] and daffinity [N, E] (either may be null: zeros).
template <typename T>
void moe_route_backward(const Context& ctx, T* dlogits, const float* dgates, const float* daffinity,
                        const float* affinity, const int32_t* index, int64_t N, int64_t E, int64_t K,
                        float route_scale);

// f [B, E] and the scalar loss (written to loss[0], on the device). scratch: N + B*E doubles.
void moe_balance_loss_forward(const Context& ctx, const float* affinity, const int32_t* index, int64_t B, int64_t T,
                              int64_t E, int64_t K, float alpha, float* f, float* loss, double* scratch);

// daffinity [N, E] for the upstream gradient dloss[0] (a device scalar, read on the device).
void moe_balance_loss_backward(const Context& ctx, float* daffinity, const float* dloss, const float* affinity,
                               const float* f, int64_t B, int64_t T, int64_t E, float alpha);

// bias[e] += gamma * sign(sum(load) - E * load[e]) (the integers compared exactly). load i32 [E].
void moe_update_bias(const Context& ctx, float* bias, const int32_t* load, int64_t E, float gamma);

}  // namespace loom::cuda
