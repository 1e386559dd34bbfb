// Optimizer arithmetic as ops: AdamW's fused update and the sum of squares behind the global gradient
// norm. Validation, then the kernel of the tensors' device (backends/<cpu|cuda>/optimizer.h). Never
// recorded by autodiff: they write parameters, moments and gradients in place.
//
// n is a parameter's element count; param, grad and the moments are f32 buffers of n elements.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::ops {

// One AdamW step's scalars: the options and the step's bias corrections 1 - beta_i^step, in double as
// PyTorch computes them.
struct AdamWStep {
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  double bias_correction1 = 1.0, bias_correction2 = 1.0;
};

// Throws unless adamw_update can run on these tensors: param, grad, exp_avg and exp_avg_sq f32 with n
// elements each, on one device this build can use; param_bf16, when defined, bf16 of param's shape on
// that device. `what` starts the message (e.g. "AdamW: parameter 'w'"), so a caller that checks every
// parameter before updating any names the one at fault.
void check_adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const Tensor& param_bf16, const std::string& what = "adamw_update");

// In place, PyTorch's torch.optim.AdamW on one parameter (cpu::adamw_update's order of operations):
//   param *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;  param -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
// param_bf16 (optional): written in the same pass with the updated param rounded to bf16, the copy a
// mixed-precision GEMM reads.
void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWStep& step,
                  const Tensor& param_bf16 = Tensor());

// The sum of x[i]^2 over every defined tensor, in double, in a fixed order (the same bits for any thread
// count). f32 tensors on the CPU or one GPU: the CPU's partial sums are added in the tensors' order, the
// GPU's are chained on the device and read back once, then added.
double sum_of_squares(const std::vector<Tensor>& tensors);
double sum_of_squares(const Tensor& x);

}  // namespace loom::ops
