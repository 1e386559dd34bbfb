// Expert parallelism: the routed experts of a MoE layer split over the mesh's `expert` axis.
//
// Legend: N this rank's tokens, C d_model, K top_k, E routed experts, G the expert axis's size,
// El = E / G the experts each rank holds (rank e of the expert group holds experts [e*El, (e+1)*El)),
// P = N*K this rank's slots, M the rows this rank receives.
//
// Each rank routes its own tokens (the router and its biases are the same on every rank), then:
//   1. orders its P slots by destination rank (stable: token order within a destination), copies each
//      slot's token row;                                                             x [N,C] -> [P,C]
//   2. exchanges the counts, then the rows, with an all-to-all (members' rows land in member order);
//                                                                                    [P,C] -> [M,C]
//   3. runs its own experts on the rows it received: ops::moe_experts with K = 1 and unit gates (the
//      same grouped GEMMs as one process);                                            [M,C] -> [M,C]
//   4. sends each result back where it came from (the reverse all-to-all);          [M,C] -> [P,C]
//   5. combines each token's K results with its gates in k order, as ops::moe_experts does.
// Every step is recorded for autodiff: the backward runs the same exchanges in reverse (the all-to-all's
// gradient is the all-to-all with the counts swapped), the experts' weight gradients come out on the
// rank that holds them, summed over every member's tokens.
//
// No token is dropped (no capacity factor). The price is memory under imbalance: a rank receives every
// slot routed to its experts, M <= G * N * min(K, El) rows, and keeps 2 * M * F floats (w1 x and w3 x)
// for the backward besides the M * C rows themselves. RankContext::max_expert_rows caps M: a rank that
// would receive more throws, naming the counts, instead of running out of memory.
#pragma once

#include "core/tensor.h"
#include "nn/parameter.h"
#include "ops/matmul.h"

namespace loom::dist {

// The routed experts of ops::moe_experts with w1, w3, w2 split over the expert axis (their `dist`
// context says how; each holds [El, ...] after the data axis's gather under fsdp_ep).
// x: [N, C]; expert_index: i32 [N, K] (global expert ids); gates: f32 [N, K] -> [N, C].
Tensor expert_parallel_experts(const Tensor& x, const Tensor& expert_index, const Tensor& gates,
                               const nn::Parameter& w1, const nn::Parameter& w3, const nn::Parameter& w2,
                               ops::MatmulPrecision precision);

}  // namespace loom::dist
