#include "parallel/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"
#include "nn/overlap.h"
#include "nn/sharded.h"
#include "ops/collective.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "parallel/pipeline.h"

namespace loom::dist {
namespace {

// The axes that split dimension `dim` of `p` (none when it is replicated).
DimSplit axis_of(const nn::Parameter& p, int dim) {
  if (p.spec.dims.empty()) return {};
  return p.spec.dims[static_cast<size_t>(dim)];
}
bool has_data_dim(const nn::Parameter& p) { return is_split_over(p, MeshAxis::Data); }

void start_bucket(OverlapState& s, const RankContext& c) {
  OverlapState::Bucket& b = s.filling;
  if (b.params.empty()) return;
  int64_t n = 0;
  for (nn::Parameter* p : b.params) n += p->value.grad().numel();
  b.flat = Tensor::empty({n});
  float* dst = b.flat.data<float>();
  for (nn::Parameter* p : b.params) {
    const Tensor g = p->value.grad();
    std::memcpy(dst, g.data<float>(), static_cast<size_t>(g.numel()) * sizeof(float));
    dst += g.numel();
    s.bucketed.insert(p);
  }
  b.work = c.comm->start_all_reduce_sum(b.flat.data<float>(), n, c.mesh.group(c.rank, MeshAxis::Data));
  s.buckets.push_back(std::move(b));
  s.filling = {};
}

}  // namespace

std::vector<TensorLayout> shard_model(models::LanguageModel& model, std::shared_ptr<const RankContext> context) {
  LOOM_CHECK(context && context->comm, "shard_model: no communicator");
  const RankContext& c = *context;
  validate_mesh_for_mode(c.mesh, c.mode);
  validate_mesh_for_ranks(c.mesh, c.comm->size(), "the " + c.comm->kind() + " communicator");
  const nlohmann::json& mj = model.model_config().json();
  // Model state (DeepSeek-V3's routing biases) stays whole and identical on every rank: the model updates
  // it from loads summed over the ranks that split the batch.
  if (mj.contains("n_routed")) validate_experts_for_mesh(mj.at("n_routed").get<int64_t>(), c.mesh, c.mode);
  if (mj.contains("num_heads")) {
    const int64_t heads = mj.at("num_heads").get<int64_t>();
    const int64_t kv = mj.value("num_kv_heads", int64_t{0}) > 0 ? mj.at("num_kv_heads").get<int64_t>() : heads;
    validate_model_for_mesh(heads, kv, c.mesh, c.mode);
  }
  auto params = model.parameters();
  std::vector<TensorLayout> layout = plan_layout(param_infos(params), c.mesh, c.mode);
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter& p = *params[i];
    LOOM_CHECK(!p.dist, "shard_model: parameter '", p.name, "' is already sharded");
    LOOM_CHECK(p.value.shape() == p.global_shape, "shard_model: parameter '", p.name, "' holds ", p.value.describe(),
               ", not its global shape ", p.global_shape);
    p.spec = layout[i].spec;
    Tensor local = copy_block(p.value, layout[i].shards[static_cast<size_t>(c.rank)]);
    local.set_requires_grad();
    p.value = local;
    p.value_changed();
    p.dist = context;
  }
  if (c.mesh.pipe > 1) {
    plan_pipeline(model, c);  // which stage runs (and trains) each parameter
    // A parameter another stage runs is not held here: an empty value, so no moments either (AdamW
    // shapes them like the value). gather_whole and checkpoints fetch it from its first stage.
    const int stage = static_cast<int>(c.coord(MeshAxis::Pipe));
    for (nn::Parameter* p : params) {
      if (std::find(p->pipe_stages.begin(), p->pipe_stages.end(), stage) != p->pipe_stages.end()) continue;
      p->value = Tensor::empty(Shape{0});
      p->value_changed();
    }
  }
  if (!context->overlap_state) context->overlap_state = std::make_shared<OverlapState>();
  model.layers_changed();  // the parameters' tensors are shards now: what a model derived from them is stale
  return layout;
}

Tensor local_batch(const Tensor& global, const RankContext& c) {
  const int64_t slices = batch_slices(c.mesh, c.mode);
  if (slices == 1) return global;
  const int64_t B = global.size(0);
  validate_batch_for_mesh(B, c.mesh, c.mode);
  const int64_t n = B / slices;
  // The slice's index: the rank's place among the ranks that split the batch (data outer, expert inner).
  const int64_t index = c.coord(MeshAxis::Data) * (is_expert_mode(c.mode) ? c.mesh.expert : 1) +
                        (is_expert_mode(c.mode) ? c.coord(MeshAxis::Expert) : 0);
  return global.slice(index * n, n);
}

void backward(const Tensor& loss, const std::vector<nn::Parameter*>& params, const RankContext& c,
              bool last_micro_batch) {
  OverlapState* s = overlap_of(c);
  // Buckets sum over data only; the expert modes' dense gradients sum over data x expert, and take the
  // blocking path in finish_gradients.
  if (!s || !last_micro_batch || c.mesh.data == 1 || is_expert_mode(c.mode)) {
    loss.backward();
    return;
  }
  // The gradients finish_gradients would all-reduce: those the FSDP gathers do not reduce-scatter.
  std::unordered_map<const TensorImpl*, nn::Parameter*> by_leaf;
  for (nn::Parameter* p : params) {
    if (!has_data_dim(*p)) by_leaf[p->value.impl()] = p;
  }
  autograd::LeafGradHook hook([&](TensorImpl* leaf) {
    auto it = by_leaf.find(leaf);
    if (it == by_leaf.end()) return;
    nn::Parameter* p = it->second;
    const Tensor g = p->value.grad();
    if (!g.defined() || g.dtype() != DType::F32 || s->bucketed.count(p)) return;  // finish_gradients takes it
    s->filling.params.push_back(p);
    s->filling.bytes += static_cast<int64_t>(g.nbytes());
    if (s->filling.bytes >= c.bucket_bytes) start_bucket(*s, c);
  });
  loss.backward();
}

void finish_gradients(const std::vector<nn::Parameter*>& params, const RankContext& c) {
  if (OverlapState* s = overlap_of(c)) {
    start_bucket_sum(*s, c);  // (a bucket the backward left open: a path the order did not foresee)
    complete_grad_sums(*s, 0);
    s->prefetch = {};
    s->current = {};
    s->forward.close();
    s->backward.close();
    start_bucket(*s, c);  // what is left of the last one
    for (OverlapState::Bucket& b : s->buckets) {
      c.comm->wait(b.work);
      const float* src = b.flat.data<float>();
      for (nn::Parameter* p : b.params) {
        Tensor g = p->value.grad();
        std::memcpy(g.data<float>(), src, static_cast<size_t>(g.numel()) * sizeof(float));
        src += g.numel();
      }
    }
    s->buckets.clear();
  }
  std::unordered_set<const nn::Parameter*> bucketed;
  if (OverlapState* s = overlap_of(c)) bucketed.swap(s->bucketed);
  const int64_t slices = batch_slices(c.mesh, c.mode);
  if (slices == 1) return;
  const float inv = 1.0f / static_cast<float>(slices);
  for (nn::Parameter* p : params) {
    Tensor g = p->value.grad();
    if (!g.defined()) continue;
    // Sum over the batch axes the parameter is replicated over. On an axis that splits it the sum is
    // already done: FSDP's gather reduce-scattered the gradient, the expert all-to-all brought every
    // member's tokens to the expert's holder. A bucket started during backward (dist::backward) already
    // summed over data.
    std::vector<MeshAxis> axes;
    for (MeshAxis a : batch_axes(c.mode)) {
      if (!is_split_over(*p, a) && c.mesh.axis_size(a) > 1) axes.push_back(a);
    }
    if (!axes.empty() && !bucketed.count(p)) c.comm->all_reduce_sum(g.data<float>(), g.numel(), c.mesh.group(c.rank, axes));
    ops::scale_(g, inv);
  }
}

double global_loss(double local_loss, const RankContext& c) {
  const int64_t slices = batch_slices(c.mesh, c.mode);
  if (slices == 1) return local_loss;
  double v = local_loss;
  c.comm->all_reduce_sum(&v, 1, c.batch_group().ranks);
  return v / static_cast<double>(slices);
}

double global_grad_norm(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                        const RankContext& c) {
  LOOM_ASSERT(params.size() == layout.size(), "global_grad_norm: ", params.size(), " parameters, ", layout.size(),
              " layouts");
  std::vector<Tensor> owned;  // the gradient blocks this rank adds, in the parameters' order
  for (const nn::Parameter* p : params) {
    const Tensor g = p->value.grad();
    if (!g.defined()) continue;
    // Each block once: on the holder whose coordinates are 0 on the axes the block is replicated over.
    bool owner = true;
    for (MeshAxis a : {MeshAxis::Data, MeshAxis::Tensor, MeshAxis::Expert}) {
      if (!is_split_over(*p, a) && c.coord(a) != 0) owner = false;
    }
    // Under a pipe axis a tied table has a gradient on two stages: the first of them counts it.
    if (!p->pipe_stages.empty() && c.coord(MeshAxis::Pipe) != p->pipe_stages.front()) owner = false;
    if (owner) owned.push_back(g);
  }
  double total = ops::sum_of_squares(owned);
  c.comm->all_reduce_sum(&total, 1, c.comm->world());
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, const std::vector<TensorLayout>& layout,
                      const RankContext& c, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = global_grad_norm(params, layout, c);
  if (std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / (norm + 1e-6));
    for (const nn::Parameter* p : params) {
      Tensor g = p->value.grad();
      if (g.defined()) ops::scale_(g, factor);
    }
  }
  return norm;
}

Tensor gather_whole(const Tensor& local, const nn::Parameter& p, const RankContext& c) {
  const bool held = p.pipe_stages.empty() || std::find(p.pipe_stages.begin(), p.pipe_stages.end(),
                                                       static_cast<int>(c.coord(MeshAxis::Pipe))) != p.pipe_stages.end();
  Tensor t = held ? local.detach().clone() : Tensor::empty(p.global_shape);
  // The gathers run inside a stage, whose ranks all hold the parameter or all do not.
  for (int d = 0; held && d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (const DimSplit a = axis_of(p, d)) t = ops::all_gather_values(t, d, c.group(a));
  }
  if (!p.pipe_stages.empty()) {  // only the stages that run it hold it: the first of them sends it
    const int64_t stride = c.mesh.data * c.mesh.expert * c.mesh.tensor;
    const int root = static_cast<int>(c.rank + (p.pipe_stages.front() - c.coord(MeshAxis::Pipe)) * stride);
    LOOM_CHECK(t.dtype() == DType::F32, "gather_whole: '", p.name, "' is ", t.describe(), ", not f32");
    c.comm->broadcast(t.data<float>(), t.numel(), root, c.mesh.group(c.rank, MeshAxis::Pipe));
  }
  return t;
}

}  // namespace loom::dist
