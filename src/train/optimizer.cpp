#include "train/optimizer.h"

#include <cmath>

#include "backends/backend.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/optimizer.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/optimizer.h"

namespace loom::train {

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
    dispatch_device("AdamW", {&p, &g, &m_[i], &v_[i]});  // one device per parameter, usable here
    LOOM_CHECK(p.dtype() == DType::F32 && g.dtype() == DType::F32, "AdamW: parameter '", name, "' is ", p.dtype(),
               " with a ", g.dtype(), " gradient; AdamW updates f32 parameters with f32 gradients");
    LOOM_CHECK(g.numel() == p.numel() && m_[i].numel() == p.numel() && v_[i].numel() == p.numel(),
               "AdamW: parameter '", name, "' has shape ", p.shape(), " but its gradient has ", g.shape(),
               " and its moments ", m_[i].shape());
  }
  ++step_;
  // In double, as PyTorch computes these Python scalars.
  const double bc1 = 1.0 - std::pow(static_cast<double>(options_.beta1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(options_.beta2), static_cast<double>(step_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i]->value;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // The bf16 copy a mixed-precision layer reads (nn::bf16_weight_of), written in the same pass.
    nn::Parameter& param = *params_[i];
    const bool copy = param.bf16_copy.defined() && param.bf16_copy.dtype() == DType::BF16 &&
                      param.bf16_copy.shape() == p.shape() && param.bf16_copy.device() == p.device();
    bf16* copy_ptr = copy ? param.bf16_copy.data<bf16>() : nullptr;
    if (p.device().is_cuda()) {
      cuda::adamw_update(cuda_context("AdamW", p.device()), p.data<float>(), g.data<float>(), m_[i].data<float>(),
                         v_[i].data<float>(), p.numel(), lr, options_.beta1, options_.beta2, options_.eps,
                         options_.weight_decay, bc1, bc2, copy_ptr);
    } else {
      cpu::adamw_update(p.data<float>(), g.data<float>(), m_[i].data<float>(), v_[i].data<float>(), p.numel(), lr,
                        options_.beta1, options_.beta2, options_.eps, options_.weight_decay, bc1, bc2, copy_ptr);
    }
    param.bf16_copy_current = copy;
  }
}

void AdamW::zero_grad() {
  // Dropping the gradients (torch's set_to_none=True) instead of zeroing them in place saves a fill and
  // an add over every gradient each step (~2% of a cs336-tinystories f32 step, ~4% in bf16): the next
  // backward() gives each parameter its freshly computed gradient without a copy.
  for (nn::Parameter* p : params_) p->value.set_grad(Tensor());
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  double total = 0.0;
  // CUDA gradients: their squares summed on the device in gradient order, read back once.
  Tensor device_total;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    const Device device = dispatch_device("global_grad_norm", {&g});
    if (device.is_cuda()) {
      if (!device_total.defined()) device_total = Tensor::zeros({2}, DType::F32, device);  // one double
      LOOM_CHECK(device_total.device() == device, "global_grad_norm: gradients are on ", device_total.device(),
                 " and ", device, "; one norm spans one device");
      cuda::add_sum_of_squares(cuda_context("global_grad_norm", device), static_cast<double*>(device_total.raw_data()),
                               g.data<float>(), g.numel());
    } else {
      total += cpu::sum_of_squares(g.data<float>(), g.numel());
    }
  }
  if (device_total.defined()) {
    const Tensor host = device_total.to(Device::cpu());
    total += *static_cast<const double*>(host.raw_data());
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = global_grad_norm(grads);
  if (std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / (norm + 1e-6));
    for (const Tensor& g : grads) {
      if (!g.defined()) continue;
      if (g.device().is_cuda()) {
        cuda::scale_forward(cuda_context("clip_grad_norm", g.device()), g.data<float>(), g.data<float>(), factor,
                            g.numel());
      } else {
        cpu::scale_forward(g.data<float>(), g.data<float>(), factor, g.numel());
      }
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
