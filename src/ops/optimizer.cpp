// AdamW and the gradient norm's sum of squares: validation, then the CPU or CUDA kernel.
#include "ops/optimizer.h"

#include "backends/backend.h"
#include "backends/cpu/optimizer.h"
#include "backends/cuda/optimizer.h"

namespace loom::ops {

void check_adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const Tensor& param_bf16, const std::string& what) {
  LOOM_CHECK(param.defined() && grad.defined() && exp_avg.defined() && exp_avg_sq.defined(), what,
             ": param ", param.describe(), ", grad ", grad.describe(), ", exp_avg ", exp_avg.describe(),
             " and exp_avg_sq ", exp_avg_sq.describe(), " must all be defined");
  // One device per parameter, usable here (before the dtypes: a CUDA tensor in a CPU-only build is
  // named as such).
  dispatch_device(what.c_str(), {&param, &grad, &exp_avg, &exp_avg_sq, &param_bf16});
  LOOM_CHECK(param.dtype() == DType::F32 && grad.dtype() == DType::F32, what, " is ", param.dtype(), " with a ",
             grad.dtype(), " gradient; AdamW updates f32 parameters with f32 gradients");
  LOOM_CHECK(exp_avg.dtype() == DType::F32 && exp_avg_sq.dtype() == DType::F32, what, ": the moments are ",
             exp_avg.describe(), " and ", exp_avg_sq.describe(), "; AdamW keeps them in f32");
  LOOM_CHECK(grad.numel() == param.numel() && exp_avg.numel() == param.numel() && exp_avg_sq.numel() == param.numel(),
             what, " has shape ", param.shape(), " but its gradient has ", grad.shape(), " and its moments ",
             exp_avg.shape());
  if (param_bf16.defined()) {
    LOOM_CHECK(param_bf16.dtype() == DType::BF16 && param_bf16.shape() == param.shape(), what, ": the bf16 copy ",
               param_bf16.describe(), " is not bf16 of the parameter's shape ", param.shape());
  }
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWStep& s,
                  const Tensor& param_bf16) {
  check_adamw_update(param, grad, exp_avg, exp_avg_sq, param_bf16);
  bf16* copy = param_bf16.defined() ? param_bf16.data<bf16>() : nullptr;
  if (param.device().is_cuda()) {
    cuda::adamw_update(cuda_context("adamw_update", param.device()), param.data<float>(), grad.data<float>(),
                       exp_avg.data<float>(), exp_avg_sq.data<float>(), param.numel(), s.lr, s.beta1, s.beta2, s.eps,
                       s.weight_decay, s.bias_correction1, s.bias_correction2, copy);
  } else {
    cpu::adamw_update(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                      param.numel(), s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.bias_correction1,
                      s.bias_correction2, copy);
  }
}

double sum_of_squares(const std::vector<Tensor>& tensors) {
  double total = 0.0;
  // GPU tensors: their squares summed on the device in the tensors' order, read back once.
  Tensor device_total;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& x = tensors[i];
    if (!x.defined()) continue;
    LOOM_CHECK(x.dtype() == DType::F32, "sum_of_squares: tensor ", i, " is ", x.describe(), "; expected f32");
    const Device device = dispatch_device("sum_of_squares", {&x});
    if (device.is_cuda()) {
      if (!device_total.defined()) device_total = Tensor::zeros({2}, DType::F32, device);  // one double
      LOOM_CHECK(device_total.device() == device, "sum_of_squares: tensors are on ", device_total.device(), " and ",
                 device, " (tensor ", i, "); one sum spans one GPU");
      cuda::add_sum_of_squares(cuda_context("sum_of_squares", device), static_cast<double*>(device_total.raw_data()),
                               x.data<float>(), x.numel());
    } else {
      total += cpu::sum_of_squares(x.data<float>(), x.numel());
    }
  }
  if (device_total.defined()) {
    const Tensor host = device_total.to(Device::cpu());
    total += *static_cast<const double*>(host.raw_data());
  }
  return total;
}

double sum_of_squares(const Tensor& x) { return sum_of_squares(std::vector<Tensor>{x}); }

}  // namespace loom::ops
