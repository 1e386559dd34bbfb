// The sharded runtime: a model whose parameters hold only this rank's shards, and the few places where
// layers and the training step talk to the other ranks.
//
// How a model runs sharded (docs/mesh.md has the whole picture):
//   * shard_model() gives every parameter its spec from the mode's table (mesh/mesh.h), keeps only this
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

#include "mesh/mesh.h"
#include "mesh/rank_context.h"
#include "models/model.h"
#include "nn/parameter.h"

namespace loom::dist {

// Checks the mesh against the communicator, the mode and the model; plans the layout; then replaces
// every parameter's value by this rank's block (a copy) and attaches the context. Call before building
// the optimizer. Returns the layout (indexed like model.parameters()).
std::vector<TensorLayout> shard_model(models::LanguageModel& model, std::shared_ptr<const RankContext> context);

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

}  // namespace loom::dist
