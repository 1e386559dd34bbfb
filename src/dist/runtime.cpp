#include "dist/runtime.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/optimizer.h"
#include "core/autograd.h"
#include "core/error.h"
#include "ops/collective.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace loom::dist {

// What overlapping communication with compute needs to remember between layers and across a step
// (docs/mesh.md, "What is overlapped"). One per rank; every rank takes the same decisions in the same
// order, so they start the same collectives in the same order.
struct OverlapState {
  // An FSDP Linear as a pass meets it: the weight, and the bias its forward gathers with it.
  struct Use {
    const nn::Parameter* weight = nullptr;
    const nn::Parameter* bias = nullptr;
  };
  // The order the forward (or the backward) pass gathers FSDP weights in, learned from the first pass:
  // complete when a weight comes round again, when the pass after it begins, or at finish_gradients.
  struct Order {
    std::vector<Use> uses;
    std::unordered_map<const nn::Parameter*, size_t> position;
    bool learned = false;
    void note(const Use& u) {
      if (learned) return;
      if (position.count(u.weight)) {
        learned = true;
        return;
      }
      position[u.weight] = uses.size();
      uses.push_back(u);
    }
    void close() { learned = learned || !uses.empty(); }
    const Use* after(const nn::Parameter* weight) const {
      if (!learned) return nullptr;
      auto it = position.find(weight);
      return it == position.end() || it->second + 1 >= uses.size() ? nullptr : &uses[it->second + 1];
    }
  };
  Order forward, backward;
  // The gathers of the next Linear, started while the current one computes: at most one in flight, so
  // at most two layers' weights are whole at a time.
  struct Prefetch {
    const nn::Parameter* weight = nullptr;
    ops::StartedCollective w, b;
  } prefetch;
  // FSDP gradients being reduce-scattered, oldest first; each is added to its shard's .grad on completion
  // (in start order, which is the order backward() would have added them in).
  struct GradSum {
    Tensor shard;
    bool accumulate = true;
    ops::StartedCollective sum;
  };
  std::deque<GradSum> grads;
  // Data-axis all-reduces of the other gradients: the bucket being filled, and the started ones.
  struct Bucket {
    std::vector<nn::Parameter*> params;
    int64_t bytes = 0;
    Tensor flat;
    Communicator::Pending work;
  };
  Bucket filling;
  std::deque<Bucket> buckets;
  std::unordered_set<const nn::Parameter*> bucketed;  // this step's, whose all-reduce has started
};

namespace {

DimSplit axis_of(const nn::Parameter& p, int dim) {
  if (p.spec.dims.empty()) return {};
  return p.spec.dims[static_cast<size_t>(dim)];
}

// An FSDP dimension: one split over data, alone or with the expert axis folded in (fsdp_ep's dense
// weights). The layer gathers it before computing, over the ranks that hold its blocks.
bool is_data_dim(const nn::Parameter& p, int dim) { return axis_of(p, dim).has(MeshAxis::Data); }
Group data_dim_group(const nn::Parameter& p, int dim, const RankContext& c) { return c.group(axis_of(p, dim)); }

// `t` gathered on every FSDP dimension of the spec, differentiably.
Tensor gather_data_dims(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) t = ops::all_gather(t, d, data_dim_group(p, d, c));
  }
  return t;
}

// y [..., N] + b [N] (broadcast over rows); db = sum over rows of dy. The row-parallel Linear adds its
// bias after the all-reduce, once.
Tensor add_bias(const Tensor& y, const Tensor& b) {
  check_dtype(y, DType::F32, "add_bias", "y");
  check_dtype(b, DType::F32, "add_bias", "b");
  const int64_t N = b.numel(), rows = y.numel() / N;
  LOOM_CHECK(y.size(-1) == N, "add_bias: y ", y.describe(), " does not end in the bias's ", N);
  Tensor out = Tensor::empty(y.shape());
  const float* src = y.data<float>();
  const float* bias = b.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < N; ++j) dst[r * N + j] = src[r * N + j] + bias[j];
  }
  autograd::record("add_bias", {y, b}, {out}, [N, rows](const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);
    Tensor db;
    if (ctx.needs_input_grad(1)) {
      db = Tensor::zeros({N});
      const float* g = dy.data<float>();
      float* acc = db.data<float>();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < N; ++j) acc[j] += g[r * N + j];
      }
    }
    return TensorList{dy, db};
  });
  return out;
}

// Calls fn(whole_offset, block_offset, run) for each contiguous run of the block in row-major order.
template <typename Fn>
void for_each_run(const Shape& whole, const Shard& s, Fn&& fn) {
  const int nd = whole.ndim();
  if (nd == 0) {
    fn(0, 0, 1);
    return;
  }
  const int64_t run = s.shape[nd - 1];
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);  // index within the block, last dim fixed at 0
  const int64_t runs = s.shape.numel() / std::max<int64_t>(run, 1);
  for (int64_t k = 0; k < runs; ++k) {
    int64_t w = 0;
    for (int d = 0; d < nd; ++d) w = w * whole[d] + s.offset[static_cast<size_t>(d)] + idx[static_cast<size_t>(d)];
    fn(w, k * run, run);
    for (int d = nd - 2; d >= 0; --d) {  // odometer over the outer dims
      if (++idx[static_cast<size_t>(d)] < s.shape[d]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

// Values only (not recorded): `t` gathered on the spec's FSDP dims, and the reverse reduce-scatter of
// a whole-tensor gradient onto the shard.
Tensor gather_data_values(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) t = ops::all_gather_values(t, d, data_dim_group(p, d, c));
  }
  return t;
}
Tensor scatter_data_values(Tensor g, const nn::Parameter& p, const RankContext& c) {
  for (int d = static_cast<int>(p.spec.dims.size()) - 1; d >= 0; --d) {
    if (is_data_dim(p, d)) g = ops::reduce_scatter_values(g, d, data_dim_group(p, d, c));
  }
  return g;
}
bool has_data_dim(const nn::Parameter& p) { return is_split_over(p, MeshAxis::Data); }
// The one FSDP dimension of the spec, or -1 (none, or several: those take the blocking path).
int data_dim(const nn::Parameter& p) {
  int found = -1;
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (is_data_dim(p, d)) {
      if (found >= 0) return -1;
      found = d;
    }
  }
  return found;
}

OverlapState* overlap_of(const RankContext& c) { return c.overlap ? c.overlap_state.get() : nullptr; }

// `p` gathered over data, started in the background (its value as it is when nothing splits it).
ops::StartedCollective start_gather(const nn::Parameter& p, const RankContext& c) {
  const int d = data_dim(p);
  if (d >= 0) return ops::start_all_gather_values(p.value, d, data_dim_group(p, d, c));
  Tensor whole = gather_data_values(p.value, p, c);  // nothing to gather (or several dims: at once)
  return ops::StartedCollective([whole] { return whole; });
}

// The whole weight (and bias) of an FSDP Linear for this pass. With overlap, the prefetched gathers
// when they are this Linear's (else gathered now), and then the gathers of the Linear the pass meets
// next start, to run while this one computes.
std::pair<Tensor, Tensor> gather_layer(const nn::Parameter& w, const nn::Parameter* b, const RankContext& c,
                                       bool backward_pass) {
  OverlapState* s = overlap_of(c);
  if (!s) return {gather_data_values(w.value, w, c), b ? gather_data_values(b->value, *b, c) : Tensor()};
  if (backward_pass) s->forward.close();  // the forward before this backward has ended
  OverlapState::Order& order = backward_pass ? s->backward : s->forward;
  order.note({&w, b});
  OverlapState::Prefetch& pre = s->prefetch;
  Tensor wf, bf;
  if (pre.weight == &w) {
    wf = pre.w.wait();
    if (b) bf = pre.b.defined() ? pre.b.wait() : gather_data_values(b->value, *b, c);
  }
  pre = {};  // a prefetch this pass did not use (another path through the model) is waited for and dropped
  if (!wf.defined()) {
    wf = gather_data_values(w.value, w, c);
    if (b) bf = gather_data_values(b->value, *b, c);
  }
  if (const OverlapState::Use* next = order.after(&w)) {
    pre.weight = next->weight;
    pre.w = start_gather(*next->weight, c);
    if (next->bias && !backward_pass) pre.b = start_gather(*next->bias, c);
  }
  return {wf, bf};
}

// A gradient of the whole `p` reduce-scattered onto its shard in the background (overlap on), added to
// the shard's .grad by finish_gradients or when a later layer's sums start. Returns false when it must
// take the blocking path (no single data dim).
bool reduce_in_background(OverlapState& s, const Tensor& grad, const nn::Parameter& p, const Tensor& shard,
                          bool accumulate, const RankContext& c) {
  const int d = data_dim(p);
  if (d < 0) return false;
  s.grads.push_back({shard, accumulate, ops::start_reduce_scatter_values(grad, d, data_dim_group(p, d, c))});
  return true;
}

void complete_grad_sum(OverlapState::GradSum& g) {
  Tensor sum = g.sum.wait();
  if (!g.accumulate) return;
  Tensor current = g.shard.grad();
  if (!current.defined()) {
    g.shard.set_grad(sum);
  } else {
    ops::add_(current, sum);  // as backward() accumulates a leaf's gradients
  }
}

// Started gradient sums before the newest `keep` are completed (by now they have had a layer's backward
// to run), bounding the whole-size gradients alive.
void complete_grad_sums(OverlapState& s, size_t keep) {
  while (s.grads.size() > keep) {
    complete_grad_sum(s.grads.front());
    s.grads.pop_front();
  }
}

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

// y = x W^T (+ b) with W (and b) split over data: W is gathered for the forward and freed when it
// returns, gathered again in the backward and freed after it, so a whole weight lives only while its
// layer computes (FSDP). x: [..., in] -> [..., out]; dW is reduce-scattered onto the shard.
Tensor fsdp_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                   ops::MatmulPrecision precision) {
  const RankContext& c = *weight.dist;
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    const auto [w_full, b_full] = gather_layer(weight, bias, c, /*backward_pass=*/false);  // freed on return
    y = ops::linear(x, w_full, b_full, ops::WeightLayout::OutIn, precision);
  }
  const Tensor w_shard = weight.value;
  const nn::Parameter* w = &weight;
  const nn::Parameter* b = bias;
  TensorList inputs{x, w_shard};
  if (bias) inputs.push_back(bias->value);
  autograd::record("fsdp_linear", inputs, {y}, [x, w_shard, w, b](const autograd::BackwardContext& ctx) {
    const RankContext& c = *w->dist;
    const Tensor& dy = ctx.grad_output(0);
    const int64_t in = x.size(-1), out = dy.size(-1), M = x.numel() / in;
    const Tensor dy2 = dy.view({M, out}), x2 = x.detach().view({M, in});
    TensorList grads(b ? 3 : 2);
    // The gather runs on every rank whatever needs_input_grad says: collectives must match up.
    const Tensor w_full = gather_layer(*w, nullptr, c, /*backward_pass=*/true).first;  // [out, in], freed on return
    if (ctx.needs_input_grad(0)) grads[0] = ops::matmul(dy2, w_full).view(x.shape());       // dx = dy W
    const Tensor dW = ops::matmul(dy2, x2, /*transpose_a=*/true);                           // dW = dy^T x
    Tensor db;
    if (b) {
      db = Tensor::zeros({out});
      const float* g = dy2.data<float>();
      float* acc = db.data<float>();
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t j = 0; j < out; ++j) acc[j] += g[r * out + j];
      }
    }
    // With overlap, the sums onto the shards run while the layers before this one compute their
    // backward; their results reach .grad in finish_gradients (the engine gets none here).
    OverlapState* s = overlap_of(c);
    const size_t before = s ? s->grads.size() : 0;
    if (!s || !reduce_in_background(*s, dW, *w, w_shard, ctx.needs_input_grad(1), c)) grads[1] = scatter_data_values(dW, *w, c);
    if (b && (!s || !reduce_in_background(*s, db, *b, b->value, ctx.needs_input_grad(2), c))) {
      grads[2] = scatter_data_values(db, *b, c);
    }
    if (s) complete_grad_sums(*s, s->grads.size() - before);  // keep only this layer's in flight
    return grads;
  });
  return y;
}

}  // namespace

Tensor copy_block(const Tensor& whole, const Shard& shard) {
  check_dtype(whole, DType::F32, "copy_block", "whole");
  Tensor out = Tensor::empty(shard.shape);
  const float* src = whole.data<float>();
  float* dst = out.data<float>();
  for_each_run(whole.shape(), shard, [&](int64_t w, int64_t b, int64_t n) {
    std::memcpy(dst + b, src + w, static_cast<size_t>(n) * sizeof(float));
  });
  return out;
}

void paste_block(Tensor& whole, const Tensor& block, const Shard& shard) {
  LOOM_CHECK(block.shape() == shard.shape, "paste_block: block ", block.describe(), " is not the shard's ", shard.shape);
  const float* src = block.data<float>();
  float* dst = whole.data<float>();
  for_each_run(whole.shape(), shard, [&](int64_t w, int64_t b, int64_t n) {
    std::memcpy(dst + w, src + b, static_cast<size_t>(n) * sizeof(float));
  });
}

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
  if (!context->overlap_state) context->overlap_state = std::make_shared<OverlapState>();
  return layout;
}

bool is_split_over(const nn::Parameter& p, MeshAxis axis) { return p.spec.splits_over(axis); }

Tensor data_gathered_value(const nn::Parameter& p) {
  LOOM_ASSERT(p.dist, "data_gathered_value: '", p.name, "' is not sharded");
  return gather_data_dims(p.value, p, *p.dist);
}

Tensor enter_tensor_split(const Tensor& x, const nn::Parameter& p) {
  if (!p.dist || !is_split_over(p, MeshAxis::Tensor)) return x;
  return ops::copy_to_group(x, p.dist->group(MeshAxis::Tensor));
}

Tensor leave_tensor_split(const Tensor& y, const nn::Parameter& p) {
  if (!p.dist || !is_split_over(p, MeshAxis::Tensor)) return y;
  return ops::all_reduce(y, p.dist->group(MeshAxis::Tensor));
}

Tensor gathered_value(const nn::Parameter& p) {
  LOOM_ASSERT(p.dist, "gathered_value: '", p.name, "' is not sharded");
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    LOOM_ASSERT(!axis_of(p, d).has(MeshAxis::Expert) || is_data_dim(p, d), "gathered_value: '", p.name,
                "' is split over the expert axis; its layer computes on its own experts (dist/expert.h)");
  }
  const RankContext& c = *p.dist;
  Tensor t = gather_data_dims(p.value, p, c);  // FSDP dims, (data, expert) ones included
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (axis_of(p, d) == DimSplit(MeshAxis::Tensor)) t = ops::gather_replicated(t, d, c.group(MeshAxis::Tensor));
  }
  return t;
}

Tensor sharded_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                      ops::MatmulPrecision precision) {
  const RankContext& c = *weight.dist;
  const bool column = weight.group == nn::ParamGroup::DenseIn && axis_of(weight, 0) == DimSplit(MeshAxis::Tensor);
  const bool row = weight.group == nn::ParamGroup::DenseOut && axis_of(weight, 1) == DimSplit(MeshAxis::Tensor);
  const bool fsdp = has_data_dim(weight);
  if (!column && !row) {  // nothing computed on tensor shards: FSDP's gather-compute-free, or a plain Linear
    if (fsdp) return fsdp_linear(x, weight, bias, precision);
    return ops::linear(x, gathered_value(weight), bias ? gathered_value(*bias) : Tensor(), ops::WeightLayout::OutIn,
                       precision);
  }
  // The local product, gathering FSDP dims around it when there are any: [out/t, in] or [out, in/t].
  auto local_linear = [&](const Tensor& in, const nn::Parameter* b) {
    if (fsdp) return fsdp_linear(in, weight, b, precision);
    return ops::linear(in, weight.value, b ? b->value : Tensor(), ops::WeightLayout::OutIn, precision);
  };
  const Group tensor = c.group(MeshAxis::Tensor);
  if (column) {
    // x: [..., C] replicated over tensor -> y: [..., out/t]. f: the input's gradient sums the ranks' parts.
    LOOM_ASSERT(!bias || !has_data_dim(*bias) || fsdp, "a column-parallel bias is never split over data");
    return local_linear(ops::copy_to_group(x, tensor), bias);
  }
  // x: [..., in/t] (this rank's heads or d_ff slice) -> partial [..., out], summed over tensor (g).
  Tensor y = ops::all_reduce(local_linear(x, nullptr), tensor);
  return bias ? add_bias(y, gather_data_dims(bias->value, *bias, c)) : y;
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
    complete_grad_sums(*s, 0);
    s->prefetch = {};
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
    cpu::scale_forward(g.data<float>(), g.data<float>(), inv, g.numel());
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
  double total = 0.0;
  for (const nn::Parameter* p : params) {
    const Tensor g = p->value.grad();
    if (!g.defined()) continue;
    // Each block once: on the holder whose coordinates are 0 on the axes the block is replicated over.
    bool owner = true;
    for (MeshAxis a : {MeshAxis::Data, MeshAxis::Tensor, MeshAxis::Expert}) {
      if (!is_split_over(*p, a) && c.coord(a) != 0) owner = false;
    }
    if (owner) total += cpu::sum_of_squares(g.data<float>(), g.numel());
  }
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
      if (g.defined()) cpu::scale_forward(g.data<float>(), g.data<float>(), factor, g.numel());
    }
  }
  return norm;
}

Tensor gather_whole(const Tensor& local, const nn::Parameter& p, const RankContext& c) {
  Tensor t = local.detach().clone();
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (const DimSplit a = axis_of(p, d)) t = ops::all_gather_values(t, d, c.group(a));
  }
  return t;
}

}  // namespace loom::dist
