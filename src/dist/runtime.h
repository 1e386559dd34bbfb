// The sharded runtime: a model whose parameters hold only this rank's shards, and the few places where
// layers and the training step talk to the other ranks.
//
// How a model runs sharded (docs/mesh.md has the whole picture):
//   * shard_model() gives every parameter its spec from the mode's table (dist/mesh.h), keeps only this
//     rank's block in `value`, and points the parameter at the RankContext. Model code is unchanged:
//     the layers look at their parameters' specs.
//   * A weight split over `data` (FSDP; under fsdp_ep the dense weights over data x expert, the expert
//     axis folded into data) is all-gathered just before the layer uses it, over the ranks that hold its
//     blocks; the gather's backward reduce-scatters the weight's gradient onto the shard
//     (ops/collective.h).
//   * A dense_in weight split over `tensor` on its output dim runs column-parallel (Megatron f on its
//     input); a dense_out weight split on its input dim runs row-parallel (Megatron g, an all-reduce,
//     on its output, then the bias). Attention then sees this rank's whole heads, the MLP its slice of
//     d_ff. Embedding, position and lm_head tables split over `tensor` on d_model are gathered before
//     use (the tensor axis computes the residual stream redundantly, so their gradients need no sum).
//   * Each data rank reads its rows of the global batch (local_batch); after backward(),
//     finish_gradients() sums over `data` the gradients the gathers did not already reduce and divides
//     by data, so every shard holds its block of the single-process gradient.
//   * The optimizer is built on the sharded parameters, so its moments are sharded the same way; the
//     gradient norm for clipping sums each block once over the whole mesh (global_grad_norm).
//   * With RankContext::overlap (the default), communication runs beside compute: FSDP gathers the next
//     Linear's weight while the current one computes and reduce-scatters gradients in the background,
//     and backward() starts the data-axis all-reduces in buckets as gradients become final; every
//     result is bitwise the same as with it off.
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "dist/mesh.h"
#include "models/model.h"
#include "nn/parameter.h"
#include "ops/matmul.h"

namespace loom::dist {

struct OverlapState;  // runtime.cpp

// What one rank knows about the run.
struct RankContext {
  Mesh mesh;
  ParallelMode mode = ParallelMode::Dp;
  Communicator* comm = nullptr;
  int rank = 0;
  // Overlap communication with compute (docs/mesh.md, "What is overlapped"): FSDP gathers the next
  // layer's weight while this one computes and reduce-scatters gradients in the background; the data
  // axis all-reduces gradients in buckets during backward (dist::backward). Off: every collective is
  // waited on where it is issued. The results are bitwise the same either way.
  bool overlap = true;
  int64_t bucket_bytes = int64_t{256} << 10;  // a gradient all-reduce starts when this much is final
  // The runtime's state for it (prefetched weights, gradient collectives in flight); made by shard_model.
  mutable std::shared_ptr<OverlapState> overlap_state{};
  // Expert parallelism: the most token rows one rank may receive for its experts in one MoE layer (0:
  // no cap beyond the natural bound; see dist/expert.h). A larger count is an error naming both.
  int64_t max_expert_rows = 0;

  int64_t coord(MeshAxis axis) const { return mesh.coord(rank, axis); }
  Group group(MeshAxis axis) const { return {comm, mesh.group(rank, axis)}; }
  // The ranks holding the blocks of a dimension split over `split` (one axis or several folded), in
  // block order: the group its gathers and reduce-scatters run on.
  Group group(const DimSplit& split) const { return {comm, mesh.split_group(rank, split)}; }
  Group world() const { return {comm, comm->world()}; }
  // The ranks that split the batch with this one (data, and expert under dp_ep / fsdp_ep).
  Group batch_group() const { return {comm, mesh.group(rank, batch_axes(mode))}; }
};

// Checks the mesh against the communicator, the mode and the model; plans the layout; then replaces
// every parameter's value by this rank's block (a copy) and attaches the context. Call before building
// the optimizer. Returns the layout (indexed like model.parameters()).
std::vector<TensorLayout> shard_model(models::LanguageModel& model, std::shared_ptr<const RankContext> context);

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

// This rank's rows of a global [B, ...] batch tensor: rows [d*B/data, (d+1)*B/data) when the mode
// splits the batch over data, slice d*expert + e of data*expert under dp_ep / fsdp_ep, else all of it.
Tensor local_batch(const Tensor& global, const RankContext& context);
// loss.backward() on a sharded model. When it is the step's last (or only) micro-batch and overlap is on,
// the data-axis all-reduce of each gradient that needs one starts, in buckets of bucket_bytes, as soon as
// backward has made the gradient final; finish_gradients waits for them. Earlier micro-batches only
// accumulate (an all-reduce of part of a sum would round differently).
void backward(const Tensor& loss, const std::vector<nn::Parameter*>& params, const RankContext& context,
              bool last_micro_batch = true);
// After backward(): completes every parameter's gradient to its block of the global gradient (waiting
// for the gradient collectives started in the background first: with overlap, an FSDP weight's gradient
// is in its .grad only from here on).
void finish_gradients(const std::vector<nn::Parameter*>& params, const RankContext& context);
// The loss of the global batch from this rank's loss (mean over data ranks).
double global_loss(double local_loss, const RankContext& context);
// sqrt of the sum of squares of the global gradient (each block counted once), the same on every rank.
double global_grad_norm(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                        const RankContext& context);
// train::clip_grad_norm's rule with the global norm. Returns the norm before clipping.
double clip_grad_norm(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                      const RankContext& context, double max_norm);
// The whole tensor of a sharded tensor laid out like `p` (its value, or an optimizer moment), assembled on
// every rank (not recorded). For checkpoints' export and tests.
Tensor gather_whole(const Tensor& local, const nn::Parameter& p, const RankContext& context);

// The block of `whole` that `shard` describes, and the reverse (writes block into whole).
Tensor copy_block(const Tensor& whole, const Shard& shard);
void paste_block(Tensor& whole, const Tensor& block, const Shard& shard);

}  // namespace loom::dist
