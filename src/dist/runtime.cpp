#include "dist/runtime.h"

#include <cmath>
#include <cstring>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/optimizer.h"
#include "core/autograd.h"
#include "core/error.h"
#include "ops/collective.h"
#include "ops/matmul.h"

namespace loom::dist {
namespace {

std::optional<MeshAxis> axis_of(const nn::Parameter& p, int dim) {
  if (p.spec.dims.empty()) return std::nullopt;
  return p.spec.dims[static_cast<size_t>(dim)];
}

// `t` gathered over the data axis on every dimension the spec splits by data (FSDP), differentiably.
Tensor gather_data_dims(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (axis_of(p, d) == MeshAxis::Data) t = ops::all_gather(t, d, c.group(MeshAxis::Data));
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

// Values only (not recorded): `t` gathered over data on the spec's data dims, and the reverse
// reduce-scatter of a whole-tensor gradient onto the shard.
Tensor gather_data_values(Tensor t, const nn::Parameter& p, const RankContext& c) {
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (axis_of(p, d) == MeshAxis::Data) t = ops::all_gather_values(t, d, c.group(MeshAxis::Data));
  }
  return t;
}
Tensor scatter_data_values(Tensor g, const nn::Parameter& p, const RankContext& c) {
  for (int d = static_cast<int>(p.spec.dims.size()) - 1; d >= 0; --d) {
    if (axis_of(p, d) == MeshAxis::Data) g = ops::reduce_scatter_values(g, d, c.group(MeshAxis::Data));
  }
  return g;
}
bool has_data_dim(const nn::Parameter& p) {
  for (const auto& a : p.spec.dims) {
    if (a == MeshAxis::Data) return true;
  }
  return false;
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
    y = ops::linear(x, gather_data_values(weight.value, weight, c),
                    bias ? gather_data_values(bias->value, *bias, c) : Tensor(), ops::WeightLayout::OutIn, precision);
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
    const Tensor w_full = gather_data_values(w_shard, *w, c);  // [out, in], freed on return
    if (ctx.needs_input_grad(0)) grads[0] = ops::matmul(dy2, w_full).view(x.shape());       // dx = dy W
    grads[1] = scatter_data_values(ops::matmul(dy2, x2, /*transpose_a=*/true), *w, c);      // dW = dy^T x
    if (b) {
      Tensor db = Tensor::zeros({out});
      const float* g = dy2.data<float>();
      float* acc = db.data<float>();
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t j = 0; j < out; ++j) acc[j] += g[r * out + j];
      }
      grads[2] = scatter_data_values(db, *b, c);
    }
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
    p.dist = context;
  }
  return layout;
}

bool is_split_over(const nn::Parameter& p, MeshAxis axis) {
  for (const auto& a : p.spec.dims) {
    if (a == axis) return true;
  }
  return false;
}

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
  LOOM_ASSERT(!is_split_over(p, MeshAxis::Expert), "gathered_value: '", p.name,
              "' is split over the expert axis; its layer computes on its own experts (dist/expert.h)");
  const RankContext& c = *p.dist;
  Tensor t = gather_data_dims(p.value, p, c);
  for (int d = 0; d < static_cast<int>(p.spec.dims.size()); ++d) {
    if (axis_of(p, d) == MeshAxis::Tensor) t = ops::gather_replicated(t, d, c.group(MeshAxis::Tensor));
  }
  return t;
}

Tensor sharded_linear(const Tensor& x, const nn::Parameter& weight, const nn::Parameter* bias,
                      ops::MatmulPrecision precision) {
  const RankContext& c = *weight.dist;
  const bool column = weight.group == nn::ParamGroup::DenseIn && axis_of(weight, 0) == MeshAxis::Tensor;
  const bool row = weight.group == nn::ParamGroup::DenseOut && axis_of(weight, 1) == MeshAxis::Tensor;
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

void finish_gradients(const std::vector<nn::Parameter*>& params, const RankContext& c) {
  const int64_t slices = batch_slices(c.mesh, c.mode);
  if (slices == 1) return;
  const float inv = 1.0f / static_cast<float>(slices);
  for (nn::Parameter* p : params) {
    Tensor g = p->value.grad();
    if (!g.defined()) continue;
    // Sum over the batch axes the parameter is replicated over. On an axis that splits it the sum is
    // already done: FSDP's gather reduce-scattered the gradient, the expert all-to-all brought every
    // member's tokens to the expert's holder.
    std::vector<MeshAxis> axes;
    for (MeshAxis a : batch_axes(c.mode)) {
      if (!is_split_over(*p, a) && c.mesh.axis_size(a) > 1) axes.push_back(a);
    }
    if (!axes.empty()) c.comm->all_reduce_sum(g.data<float>(), g.numel(), c.mesh.group(c.rank, axes));
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
      bool split = false;
      for (const auto& d : p->spec.dims) split = split || d == a;
      if (!split && c.coord(a) != 0) owner = false;
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
    if (auto a = axis_of(p, d)) t = ops::all_gather_values(t, d, c.group(*a));
  }
  return t;
}

}  // namespace loom::dist
