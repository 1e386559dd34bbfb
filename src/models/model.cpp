#include "models/model.h"

#include <cstring>

#include "core/autograd.h"
#include "core/error.h"
#include "mesh/mesh.h"
#include "mesh/rank_context.h"

namespace loom::models {

Tensor LanguageModel::decode_last(const Tensor& ids, nn::DecodeCache& cache) const {
  Tensor all = decode(ids, cache);  // [B, t, V]
  const int64_t B = all.size(0), t = all.size(1), V = all.size(2);
  Tensor last = Tensor::empty({B, 1, V}, all.dtype());
  const size_t row = static_cast<size_t>(V) * dtype_size(all.dtype());
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(static_cast<char*>(last.raw_data()) + b * row, static_cast<const char*>(all.raw_data()) + ((b * t) + t - 1) * row, row);
  }
  return last;
}

void LanguageModel::load_parameter(const std::string& name, const Tensor& values) {
  nn::Parameter& p = parameter(name);
  // Under a pipe axis a rank holds only the parameters its stage runs (parallel/pipeline.h): the others'
  // values are empty here and loading them keeps nothing.
  if (p.dist && !p.pipe_stages.empty() && p.value.numel() == 0 && p.global_shape.numel() > 0) {
    LOOM_CHECK(values.shape() == p.global_shape, "load_parameter: '", name, "' has shape ", p.global_shape,
               " but the given values have shape ", values.shape());
    return;
  }
  if (p.dist && values.shape() == p.global_shape && p.value.shape() != p.global_shape) {
    // A sharded model takes whole tensors and keeps its block: checkpoints reshard on load.
    const dist::RankContext& c = *p.dist;
    const Tensor whole = values.dtype() == DType::F32 ? values : values.to(DType::F32);
    p.value.copy_from(dist::copy_block(whole, dist::shard_of(name, p.global_shape, p.spec, c.mesh, c.rank)));
    p.value_changed();
    return;
  }
  LOOM_CHECK(values.shape() == p.value.shape(), "load_parameter: '", name, "' has shape ", p.value.shape(),
             " but the given values have shape ", values.shape());
  Tensor v = values.dtype() == p.value.dtype() ? values : values.to(p.value.dtype());
  p.value.copy_from(v);
  p.value_changed();  // a mixed-precision bf16 copy no longer matches
}

void LanguageModel::load_state(const std::string& name, const Tensor& values) {
  std::string known;
  for (auto& [n, t] : state_tensors()) {
    if (n != name) {
      known += (known.empty() ? "" : ", ") + n;
      continue;
    }
    LOOM_CHECK(values.shape() == t.shape(), "load_state: '", name, "' has shape ", t.shape(),
               " but the given values have shape ", values.shape());
    Tensor v = values.dtype() == t.dtype() ? values : values.to(t.dtype());
    Tensor dst = t;
    dst.copy_from(v);
    return;
  }
  LOOM_FAIL("load_state: the model has no state tensor '", name, "' (it has: ", known.empty() ? "none" : known, ")");
}

int64_t LanguageModel::num_parameters() {
  int64_t n = 0;
  for (nn::Parameter* p : parameters()) n += p->value.numel();
  return n;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Full: return "full";
    case Recompute::Selective: return "selective";
  }
  return "none";
}

Recompute recompute_from_name(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "full") return Recompute::Full;
  if (name == "selective") return Recompute::Selective;
  LOOM_FAIL("training.recompute must be \"none\", \"full\" or \"selective\", got \"", name, "\"");
}

TensorList recompute_block(const ForwardContext& ctx, const TensorList& inputs,
                           std::function<TensorList(const TensorList&)> fn) {
  if (!ctx.training || ctx.recompute == Recompute::None || !autograd::any_requires_grad(inputs)) return fn(inputs);
  return autograd::checkpoint(ctx.recompute == Recompute::Full ? "recompute_full" : "recompute_selective", inputs,
                              std::move(fn), ctx.recompute == Recompute::Selective);
}

Tensor recompute_block(const ForwardContext& ctx, const Tensor& x, std::function<Tensor(const Tensor&)> fn) {
  if (!ctx.training || ctx.recompute == Recompute::None || !autograd::any_requires_grad({x})) return fn(x);
  return recompute_block(ctx, TensorList{x}, [fn = std::move(fn)](const TensorList& in) { return TensorList{fn(in[0])}; })[0];
}

Tensor LanguageModel::stage_forward(int64_t, int64_t, const Tensor&, const Tensor&, const Tensor&,
                                    const ForwardContext&, Tensor*) const {
  LOOM_FAIL("model family ", arch(), " cannot be cut into pipeline stages (the pipe axis runs llama, gpt2 and deepseek_v3)");
}

int LanguageModel::pipeline_ends(const nn::Parameter& p) const {
  return p.group == nn::ParamGroup::Embedding || p.group == nn::ParamGroup::Position ? 1 : 2;
}

}  // namespace loom::models
