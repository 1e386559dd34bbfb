// Layers on sharded parameters: the few places where a layer talks to the other ranks.
//
// A parameter whose `dist` is set holds only this rank's block (parallel/runtime.h's shard_model put it
// there). Layers never look at the mesh themselves: nn::compute_value and nn::Linear call these, and a
// family that computes on shards itself (DeepSeek-V3's MLA and experts) calls the ones below by name.
//   * A weight split over `data` (FSDP) is all-gathered just before the layer uses it; the gather's
//     backward reduce-scatters the weight's gradient onto the shard (ops/collective.h).
//   * A dense_in weight split over `tensor` on its output dim runs column-parallel (Megatron f on its
//     input); a dense_out weight split on its input dim runs row-parallel (Megatron g, an all-reduce, on
//     its output, then the bias).
//   * With RankContext::overlap, the FSDP Linear gathers the next Linear's weight while this one computes
//     and reduce-scatters gradients in the background (nn/overlap.h: the state it shares with the step's
//     gradient sums in parallel/runtime.cpp). Every result is bitwise the same with overlap off.
#pragma once

#include <vector>

#include "mesh/mesh.h"
#include "mesh/rank_context.h"
#include "nn/parameter.h"
#include "ops/matmul.h"

namespace loom::dist {

// A parameter gathered over every split axis, differentiably (nn::compute_value).
Tensor gathered_value(const nn::Parameter& p);
// A parameter gathered on its FSDP dimensions only (those split over data, alone or folded with expert),
// differentiably, leaving tensor and expert splits local: for layers that compute on their tensor or
// expert shards themselves (MoE experts).
Tensor data_gathered_value(const nn::Parameter& p);
// Megatron's f and g for a layer that computes on `p`'s tensor shards outside sharded_linear: x enters
// (identity; its gradient sums over tensor) and the partial result leaves (sum over tensor). Identity
// when p is not split over tensor.
Tensor enter_tensor_split(const Tensor& x, const nn::Parameter& p);
Tensor leave_tensor_split(const Tensor& y, const nn::Parameter& p);
// Whether p is split over `axis` (alone, or folded with another axis on one dimension).
bool is_split_over(const nn::Parameter& p, MeshAxis axis);

// Linear's forward on a sharded weight (column- or row-parallel, FSDP gathers), see above.
Tensor sharded_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                      ops::MatmulPrecision precision);

// What the layout needs to know of each parameter (mesh/mesh.h plan_layout).
std::vector<ParamInfo> param_infos(const std::vector<nn::Parameter*>& params);

}  // namespace loom::dist
