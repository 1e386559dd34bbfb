#include "nn/parameter.h"

#include "dist/runtime.h"

namespace loom::nn {

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::DenseIn: return "dense_in";
    case ParamGroup::DenseOut: return "dense_out";
    case ParamGroup::Embedding: return "embedding";
    case ParamGroup::LmHead: return "lm_head";
    case ParamGroup::Norm: return "norm";
    case ParamGroup::Bias: return "bias";
    case ParamGroup::Position: return "position";
    case ParamGroup::DenseInWhole: return "dense_in_whole";
    case ParamGroup::ExpertIn: return "expert_in";
    case ParamGroup::ExpertOut: return "expert_out";
  }
  return "?";
}

Tensor compute_value(const Parameter& p) { return p.dist ? dist::gathered_value(p) : p.value; }

namespace {
thread_local bool skip_init = false;
}  // namespace

SkipInitGuard::SkipInitGuard() : previous_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = previous_; }

Parameter make_parameter(const std::string& name, const Shape& shape, const Init& init, RngKey key, ParamGroup group) {
  Parameter p;
  p.name = name;
  p.group = group;
  p.global_shape = shape;
  p.spec = dist::PartitionSpec::replicated();
  p.value = Tensor::empty(shape);
  switch (skip_init ? Init::Kind::Zeros : init.kind) {
    case Init::Kind::Zeros:
      if (!skip_init) p.value.fill_(0.0f);
      break;
    case Init::Kind::Ones: p.value.fill_(1.0f); break;
    case Init::Kind::TruncatedNormal: {
      float bound = init.cutoff * init.std;
      fill_truncated_normal(p.value.data<float>(), p.value.numel(), key.fold_in(name), /*offset=*/0, 0.0f,
                            init.std, -bound, bound);
      break;
    }
    case Init::Kind::Normal:
      fill_normal(p.value.data<float>(), p.value.numel(), key.fold_in(name), /*offset=*/0, 0.0f, init.std);
      break;
  }
  p.value.set_requires_grad();
  return p;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& p : own_) out.push_back(p.get());
  for (Module* child : children_) {
    auto sub = child->parameters();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

Parameter& Module::parameter(const std::string& name) {
  for (Parameter* p : parameters()) {
    if (p->name == name) return *p;
  }
  LOOM_FAIL("no parameter named '", name, "'");
}

Parameter& Module::add_parameter(Parameter p) {
  own_.push_back(std::make_unique<Parameter>(std::move(p)));
  return *own_.back();
}

}  // namespace loom::nn
