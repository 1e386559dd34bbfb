#include "nn/parameter.h"

#include <algorithm>

#include "core/autograd.h"
#include "nn/sharded.h"
#include "ops/elementwise.h"

namespace loom::nn {

Tensor compute_value(const Parameter& p) { return p.dist ? dist::gathered_value(p) : p.value; }

Tensor bf16_weight_of(Parameter& p) {
  LOOM_ASSERT(!p.dist, p.name, ": bf16_weight_of is for unsharded parameters");
  const Tensor& v = p.value;
  LOOM_CHECK(v.dtype() == DType::F32, p.name, ": a bf16 copy is made of f32 weights, got ",
             v.describe());
  const bool fits = p.bf16_copy.defined() && p.bf16_copy.shape() == v.shape() && p.bf16_copy.dtype() == DType::BF16;
  if (p.bf16_copy_current && fits) return p.bf16_copy;
  // Only a parameter being trained keeps a copy (its optimizer then maintains it); inference converts
  // afresh, leaving the Parameter untouched, so concurrent forwards never write shared state.
  if (!(autograd::grad_enabled() && v.requires_grad())) return v.to(DType::BF16);
  if (!fits) p.bf16_copy = Tensor::empty(v.shape(), DType::BF16, v.device());
  ops::convert_(p.bf16_copy, v);
  p.bf16_copy_current = false;  // becomes current when the optimizer writes it with the value
  return p.bf16_copy;
}

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
    case Init::Kind::Uniform:
      fill_uniform(p.value.data<float>(), p.value.numel(), key.fold_in(name), /*offset=*/0, -init.std, init.std);
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

void Module::add_child(Module* child) {
  LOOM_ASSERT(child != nullptr && child->parent_ == nullptr, "Module::add_child: a module has one parent");
  child->parent_ = this;
  children_.push_back(child);
}

void Module::remove_child(Module* child) {
  auto it = std::find(children_.begin(), children_.end(), child);
  LOOM_ASSERT(it != children_.end(), "Module::remove_child: not a child of this module");
  children_.erase(it);
  child->parent_ = nullptr;
}

void Module::layers_changed() {
  for (Module* m = this; m != nullptr; m = m->parent_) m->on_layers_changed();
}

Parameter& Module::add_parameter(Parameter p) {
  own_.push_back(std::make_unique<Parameter>(std::move(p)));
  return *own_.back();
}

}  // namespace loom::nn
