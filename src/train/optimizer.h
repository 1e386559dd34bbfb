// Optimizer math: AdamW, global-norm gradient clipping, the cosine schedule with warmup.
// The training loop (src/train/trainer.*) composes these; they never allocate after the first step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/parameter.h"

namespace loom::train {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  void validate() const;
};

// AdamW with PyTorch's semantics (decoupled weight decay, bias correction). State is laid out like
// each parameter's local shard: m and v have the parameter's shape and exist from construction.
// zero_grad() drops the gradients, as torch's default zero_grad(set_to_none=True) does: a parameter
// that receives no gradient before the next step() is left alone by it (no decay, no moment update).
class AdamW {
 public:
  AdamW(std::vector<nn::Parameter*> params, AdamWOptions options);

  // Applies one update with learning rate `lr` (the schedule's value) to every parameter with a grad.
  void step(float lr);
  void step() { step(options_.lr); }
  // Drops every parameter's gradient (set_to_none); backward() then sets fresh ones.
  void zero_grad();

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  const AdamWOptions& options() const { return options_; }
  const std::vector<nn::Parameter*>& params() const { return params_; }
  // First and second moments for params()[i].
  Tensor& exp_avg(size_t i) { return m_[i]; }
  Tensor& exp_avg_sq(size_t i) { return v_[i]; }

 private:
  std::vector<nn::Parameter*> params_;
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
  int64_t step_ = 0;
};

// sqrt(sum of squares of all gradients), in a fixed order. Missing gradients are skipped.
double global_grad_norm(const std::vector<Tensor>& grads);
// Scales all gradients by max_norm / (norm + 1e-6) when their global norm exceeds max_norm.
// Returns the norm before clipping (non-finite if any gradient is).
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);
std::vector<Tensor> gradients_of(const std::vector<nn::Parameter*>& params);

// CS336's schedule: linear warmup to max_lr over warmup_steps, cosine decay to min_lr at
// cosine_steps, min_lr afterwards.
float cosine_lr(int64_t step, float max_lr, float min_lr, int64_t warmup_steps, int64_t cosine_steps);

}  // namespace loom::train
