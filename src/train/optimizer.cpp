#include "train/optimizer.h"

#include <cmath>

#include "ops/elementwise.h"
#include "ops/optimizer.h"

namespace loom::train {

namespace {
// The parameter's bf16 copy when it can be written with the update (allocated by nn::bf16_weight_of, of
// the value's shape on its device), else undefined: a copy that does not fit is left alone and stays stale.
Tensor bf16_copy_of(const nn::Parameter& p) {
  const Tensor& c = p.bf16_copy;
  const bool fits = c.defined() && c.dtype() == DType::BF16 && c.shape() == p.value.shape() &&
                    c.device() == p.value.device();
  return fits ? c : Tensor();
}
}  // namespace

void AdamWOptions::validate() const {
  LOOM_CHECK(lr >= 0 && std::isfinite(lr), "optimizer.lr must be a finite number >= 0, got ", lr);
  LOOM_CHECK(beta1 >= 0 && beta1 < 1, "optimizer.beta1 must be in [0, 1), got ", beta1);
  LOOM_CHECK(beta2 >= 0 && beta2 < 1, "optimizer.beta2 must be in [0, 1), got ", beta2);
  LOOM_CHECK(eps > 0, "optimizer.eps must be > 0, got ", eps);
  LOOM_CHECK(weight_decay >= 0, "optimizer.weight_decay must be >= 0, got ", weight_decay);
}

AdamW::AdamW(std::vector<nn::Parameter*> params, AdamWOptions options)
    : params_(std::move(params)), options_(options), m_(params_.size()), v_(params_.size()) {
  options_.validate();
  // The moments are allocated here, before the first step. Gradients are not: backward() hands each
  // parameter the gradient buffer it computed, which the caching allocator serves again every step.
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i]->value;
    m_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
    v_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
  }
}

void AdamW::step(float lr) {
  // Every check before anything changes: a step that throws must neither count nor update half the
  // parameters (the Python binding once counted steps that failed).
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i]->value;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const std::string& name = params_[i]->name;
    LOOM_CHECK(p.defined(), "AdamW: parameter '", name, "' has a gradient but no value");
    ops::check_adamw_update(p, g, m_[i], v_[i], bf16_copy_of(*params_[i]), str("AdamW: parameter '", name, "'"));
  }
  ++step_;
  // In double, as PyTorch computes these Python scalars.
  const double bc1 = 1.0 - std::pow(static_cast<double>(options_.beta1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(options_.beta2), static_cast<double>(step_));
  const ops::AdamWStep step{lr, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, bc1, bc2};
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i]->value;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // The bf16 copy a mixed-precision layer reads (nn::bf16_weight_of), written in the same pass.
    nn::Parameter& param = *params_[i];
    const Tensor copy = bf16_copy_of(param);
    ops::adamw_update(p, g, m_[i], v_[i], step, copy);
    param.bf16_copy_current = copy.defined();
  }
}

void AdamW::zero_grad() {
  // Dropping the gradients (torch's set_to_none=True) instead of zeroing them in place saves a fill and
  // an add over every gradient each step (~2% of a cs336-tinystories f32 step, ~4% in bf16): the next
  // backward() gives each parameter its freshly computed gradient without a copy.
  for (nn::Parameter* p : params_) p->value.set_grad(Tensor());
}

double global_grad_norm(const std::vector<Tensor>& grads) { return std::sqrt(ops::sum_of_squares(grads)); }

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = global_grad_norm(grads);
  if (std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / (norm + 1e-6));
    for (Tensor g : grads) {
      if (g.defined()) ops::scale_(g, factor);
    }
  }
  return norm;
}

std::vector<Tensor> gradients_of(const std::vector<nn::Parameter*>& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const nn::Parameter* p : params) grads.push_back(p->value.grad());
  return grads;
}

float cosine_lr(int64_t step, float max_lr, float min_lr, int64_t warmup_steps, int64_t cosine_steps) {
  if (step < warmup_steps) return static_cast<float>(step) / static_cast<float>(warmup_steps) * max_lr;
  if (step <= cosine_steps) {
    if (cosine_steps == warmup_steps) return min_lr;
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(cosine_steps - warmup_steps);
    return static_cast<float>(min_lr + 0.5 * (1.0 + std::cos(progress * M_PI)) * (max_lr - min_lr));
  }
  return min_lr;
}

}  // namespace loom::train
