// RMSNorm and LayerNorm: validation, CPU dispatch, and the recorded backward.
//
// Both save the per-row statistics (rstd, and mean for LayerNorm: [R] floats, tiny next to x) plus x
// itself, so the backward needs no recomputation of the reductions. Parameter gradients come from the
// kernels' fixed-chunk partial sums: bitwise the same for any thread count (see backends/cpu/norm.h).
#include "ops/norm.h"

#include <cmath>

#include "backends/backend.h"
#include "backends/cpu/norm.h"
#include "backends/cuda/norm.h"
#include "core/autograd.h"

namespace loom::ops {
namespace {

// Checks x: [..., C] against a [C] parameter; returns C.
int64_t check_norm_args(const Tensor& x, const Tensor& weight, const Tensor* bias, float eps, const char* op) {
  LOOM_CHECK(x.defined(), op, ": x is undefined");
  LOOM_CHECK(x.ndim() >= 1, op, ": x must have shape [..., C], got a scalar ", x.describe());
  check_dtype(weight, DType::F32, op, "weight");
  const int64_t C = x.shape().back();
  LOOM_CHECK(C > 0, op, ": x has C=0 (shape ", x.shape(), "); there is nothing to normalise");
  LOOM_CHECK(weight.ndim() == 1 && weight.size(0) == C, op, ": weight has shape ", weight.shape(),
             " but x has shape ", x.shape(), " (C=", C, ")");
  if (bias != nullptr && bias->defined()) {
    check_dtype(*bias, DType::F32, op, "bias");
    LOOM_CHECK(bias->ndim() == 1 && bias->size(0) == C, op, ": bias has shape ", bias->shape(),
               " but x has shape ", x.shape(), " (C=", C, ")");
    check_same_device(x, *bias, op);
  }
  LOOM_CHECK(std::isfinite(eps) && eps >= 0.0f, op, ": eps must be finite and >= 0, got eps=", eps);
  check_same_device(x, weight, op);
  // Every norm has CUDA kernels: each op dispatches itself (dispatch_device checks the device).
  return C;
}

// y's dtype: x's, or bf16 for an f32 x (mixed precision, CPU only).
DType output_dtype(const Tensor& x, std::optional<DType> y_dtype, const char* op) {
  const DType y = y_dtype.value_or(x.dtype());
  LOOM_CHECK(y == x.dtype() || (x.dtype() == DType::F32 && y == DType::BF16), op, ": y_dtype ", y,
             " for x ", x.describe(), ": y has x's dtype, or is bf16 for an f32 x");
  LOOM_CHECK(y == x.dtype() || x.device().is_cpu(), op, ": an f32 x with a bf16 y runs on the CPU only so far, got ",
             x.describe());
  return y;
}

// The upstream gradient in the dtype the kernels pair with x (it normally already is).
Tensor grad_as(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, std::optional<DType> y_dtype) {
  const int64_t C = check_norm_args(x, weight, nullptr, eps, "rms_norm");
  LOOM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "rms_norm: x must be f32 or bf16, got ",
             x.describe());
  const DType ydt = output_dtype(x, y_dtype, "rms_norm");
  const int64_t rows = x.numel() / C;
  const bool recording = autograd::any_requires_grad({x, weight});
  const Device device = dispatch_device("rms_norm", {&x, &weight});  // before allocating: errors name the op
  Tensor y = Tensor::empty(x.shape(), ydt, x.device());
  Tensor rstd = recording ? Tensor::empty(Shape{rows}, DType::F32, x.device()) : Tensor();
  float* rstd_ptr = recording ? rstd.data<float>() : nullptr;
  if (device.is_cuda()) {
    LOOM_CHECK(ydt == x.dtype(), "rms_norm: a ", dtype_name(ydt), " output from ", dtype_name(x.dtype()),
               " input has no CUDA kernel yet");
    const cuda::Context& cu = cuda_context("rms_norm", device);
    if (x.dtype() == DType::F32) {
      cuda::rms_norm_forward(cu, y.data<float>(), rstd_ptr, x.data<float>(), weight.data<float>(), rows, C, eps);
    } else {
      cuda::rms_norm_forward(cu, y.data<bf16>(), rstd_ptr, x.data<bf16>(), weight.data<float>(), rows, C, eps);
    }
  } else if (x.dtype() == DType::F32 && ydt == DType::BF16) {
    cpu::rms_norm_forward(y.data<bf16>(), rstd_ptr, x.data<float>(), weight.data<float>(), rows, C, eps);
  } else if (x.dtype() == DType::F32) {
    cpu::rms_norm_forward(y.data<float>(), rstd_ptr, x.data<float>(), weight.data<float>(), rows, C, eps);
  } else {
    cpu::rms_norm_forward(y.data<bf16>(), rstd_ptr, x.data<bf16>(), weight.data<float>(), rows, C, eps);
  }
  autograd::record("rms_norm", {x, weight}, {y}, [x, weight, rstd, rows, C](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), x.dtype());
    const Device device = dispatch_device("rms_norm backward", {&dy, &x, &weight});
    Tensor dx = ctx.needs_input_grad(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor dw = ctx.needs_input_grad(1) ? Tensor::empty(weight.shape(), DType::F32, x.device()) : Tensor();
    float* dw_ptr = dw.defined() ? dw.data<float>() : nullptr;
    if (device.is_cuda()) {
      const cuda::Context& cu = cuda_context("rms_norm backward", device);
      if (x.dtype() == DType::F32) {
        cuda::rms_norm_backward(cu, dx.defined() ? dx.data<float>() : nullptr, dw_ptr, dy.data<float>(),
                                x.data<float>(), weight.data<float>(), rstd.data<float>(), rows, C);
      } else {
        cuda::rms_norm_backward(cu, dx.defined() ? dx.data<bf16>() : nullptr, dw_ptr, dy.data<bf16>(),
                                x.data<bf16>(), weight.data<float>(), rstd.data<float>(), rows, C);
      }
    } else if (x.dtype() == DType::F32) {
      cpu::rms_norm_backward(dx.defined() ? dx.data<float>() : nullptr, dw_ptr, dy.data<float>(), x.data<float>(),
                             weight.data<float>(), rstd.data<float>(), rows, C);
    } else {
      cpu::rms_norm_backward(dx.defined() ? dx.data<bf16>() : nullptr, dw_ptr, dy.data<bf16>(), x.data<bf16>(),
                             weight.data<float>(), rstd.data<float>(), rows, C);
    }
    return TensorList{dx, dw};
  });
  return y;
}

AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                        std::optional<DType> normed_dtype) {
  const int64_t C = check_norm_args(x, weight, nullptr, eps, "add_rms_norm");
  LOOM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "add_rms_norm: x must be f32 or bf16, got ",
             x.describe());
  LOOM_CHECK(residual.defined(), "add_rms_norm: residual is undefined");
  LOOM_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(), "add_rms_norm: residual is ",
             residual.describe(), " but x is ", x.describe(), " (they must match)");
  check_same_device(x, residual, "add_rms_norm");
  const DType ydt = output_dtype(x, normed_dtype, "add_rms_norm");
  const int64_t rows = x.numel() / C;
  const bool recording = autograd::any_requires_grad({x, residual, weight});
  const Device device = dispatch_device("add_rms_norm", {&x, &residual, &weight});  // before allocating
  Tensor sum = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y = Tensor::empty(x.shape(), ydt, x.device());
  Tensor rstd = recording ? Tensor::empty(Shape{rows}, DType::F32, x.device()) : Tensor();
  float* rstd_ptr = recording ? rstd.data<float>() : nullptr;
  if (device.is_cuda()) {
    LOOM_CHECK(ydt == x.dtype(), "add_rms_norm: a ", dtype_name(ydt), " output from ", dtype_name(x.dtype()),
               " input has no CUDA kernel yet");
    const cuda::Context& cu = cuda_context("add_rms_norm", device);
    if (x.dtype() == DType::F32) {
      cuda::add_rms_norm_forward(cu, sum.data<float>(), y.data<float>(), rstd_ptr, x.data<float>(),
                                 residual.data<float>(), weight.data<float>(), rows, C, eps);
    } else {
      cuda::add_rms_norm_forward(cu, sum.data<bf16>(), y.data<bf16>(), rstd_ptr, x.data<bf16>(), residual.data<bf16>(),
                                 weight.data<float>(), rows, C, eps);
    }
  } else if (x.dtype() == DType::F32 && ydt == DType::BF16) {
    cpu::add_rms_norm_forward(sum.data<float>(), y.data<bf16>(), rstd_ptr, x.data<float>(), residual.data<float>(),
                              weight.data<float>(), rows, C, eps);
  } else if (x.dtype() == DType::F32) {
    cpu::add_rms_norm_forward(sum.data<float>(), y.data<float>(), rstd_ptr, x.data<float>(), residual.data<float>(),
                              weight.data<float>(), rows, C, eps);
  } else {
    cpu::add_rms_norm_forward(sum.data<bf16>(), y.data<bf16>(), rstd_ptr, x.data<bf16>(), residual.data<bf16>(),
                              weight.data<float>(), rows, C, eps);
  }
  // The backward needs sum, an output of this op: it keeps a detached handle, since capturing `sum`
  // itself would make a cycle (sum -> node -> closure -> sum) that leaks if backward never runs.
  autograd::record("add_rms_norm", {x, residual, weight}, {sum, y},
                   [saved_sum = sum.detach(), weight, rstd, rows, C](const autograd::BackwardContext& ctx) {
    const DType dtype = saved_sum.dtype();
    const Tensor dsum = grad_as(ctx.grad_output(0), dtype);
    const Tensor dy = grad_as(ctx.grad_output(1), dtype);
    const bool need_dx = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
    Tensor dtotal = Tensor::empty(saved_sum.shape(), dtype, saved_sum.device());
    Tensor dw = ctx.needs_input_grad(2) ? Tensor::empty(weight.shape(), DType::F32, saved_sum.device()) : Tensor();
    float* dw_ptr = dw.defined() ? dw.data<float>() : nullptr;
    const Device device = dispatch_device("add_rms_norm backward", {&dy, &dsum, &saved_sum, &weight});
    if (device.is_cuda()) {
      const cuda::Context& cu = cuda_context("add_rms_norm backward", device);
      if (dtype == DType::F32) {
        cuda::add_rms_norm_backward(cu, dtotal.data<float>(), dw_ptr, dy.data<float>(), dsum.data<float>(),
                                    saved_sum.data<float>(), weight.data<float>(), rstd.data<float>(), rows, C);
      } else {
        cuda::add_rms_norm_backward(cu, dtotal.data<bf16>(), dw_ptr, dy.data<bf16>(), dsum.data<bf16>(),
                                    saved_sum.data<bf16>(), weight.data<float>(), rstd.data<float>(), rows, C);
      }
    } else if (dtype == DType::F32) {
      cpu::add_rms_norm_backward(dtotal.data<float>(), dw_ptr, dy.data<float>(), dsum.data<float>(),
                                 saved_sum.data<float>(), weight.data<float>(), rstd.data<float>(), rows, C);
    } else {
      cpu::add_rms_norm_backward(dtotal.data<bf16>(), dw_ptr, dy.data<bf16>(), dsum.data<bf16>(),
                                 saved_sum.data<bf16>(), weight.data<float>(), rstd.data<float>(), rows, C);
    }
    if (!need_dx) dtotal = Tensor();
    // x and residual get the same gradient; the engine never modifies a returned gradient in place.
    return TensorList{ctx.needs_input_grad(0) ? dtotal : Tensor(), ctx.needs_input_grad(1) ? dtotal : Tensor(), dw};
  });
  return {sum, y};
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, std::optional<DType> y_dtype) {
  const int64_t C = check_norm_args(x, weight, &bias, eps, "layer_norm");
  LOOM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "layer_norm: x must be f32 or bf16, got ",
             x.describe());
  const DType ydt = output_dtype(x, y_dtype, "layer_norm");
  const int64_t rows = x.numel() / C;
  const bool has_bias = bias.defined();
  const bool recording = autograd::any_requires_grad({x, weight, bias});
  const Device device = dispatch_device("layer_norm", {&x, &weight, &bias});  // before allocating: errors name the op
  Tensor y = Tensor::empty(x.shape(), ydt, x.device());
  Tensor mean = recording ? Tensor::empty(Shape{rows}, DType::F32, x.device()) : Tensor();
  Tensor rstd = recording ? Tensor::empty(Shape{rows}, DType::F32, x.device()) : Tensor();
  float* mean_ptr = recording ? mean.data<float>() : nullptr;
  float* rstd_ptr = recording ? rstd.data<float>() : nullptr;
  const float* bias_ptr = has_bias ? bias.data<float>() : nullptr;
  if (device.is_cuda()) {
    LOOM_CHECK(ydt == x.dtype(), "layer_norm: a ", dtype_name(ydt), " output from ", dtype_name(x.dtype()),
               " input has no CUDA kernel yet");
    const cuda::Context& cu = cuda_context("layer_norm", device);
    if (x.dtype() == DType::F32) {
      cuda::layer_norm_forward(cu, y.data<float>(), mean_ptr, rstd_ptr, x.data<float>(), weight.data<float>(),
                               bias_ptr, rows, C, eps);
    } else {
      cuda::layer_norm_forward(cu, y.data<bf16>(), mean_ptr, rstd_ptr, x.data<bf16>(), weight.data<float>(),
                               bias_ptr, rows, C, eps);
    }
  } else if (x.dtype() == DType::F32 && ydt == DType::BF16) {
    cpu::layer_norm_forward(y.data<bf16>(), mean_ptr, rstd_ptr, x.data<float>(), weight.data<float>(), bias_ptr,
                            rows, C, eps);
  } else if (x.dtype() == DType::F32) {
    cpu::layer_norm_forward(y.data<float>(), mean_ptr, rstd_ptr, x.data<float>(), weight.data<float>(), bias_ptr,
                            rows, C, eps);
  } else {
    cpu::layer_norm_forward(y.data<bf16>(), mean_ptr, rstd_ptr, x.data<bf16>(), weight.data<float>(), bias_ptr,
                            rows, C, eps);
  }
  autograd::record("layer_norm", {x, weight, bias}, {y},
                   [x, weight, mean, rstd, rows, C, has_bias](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), x.dtype());
    Tensor dx = ctx.needs_input_grad(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor dw = ctx.needs_input_grad(1) ? Tensor::empty(weight.shape(), DType::F32, x.device()) : Tensor();
    Tensor db = has_bias && ctx.needs_input_grad(2) ? Tensor::empty(weight.shape(), DType::F32, x.device()) : Tensor();
    float* dw_ptr = dw.defined() ? dw.data<float>() : nullptr;
    float* db_ptr = db.defined() ? db.data<float>() : nullptr;
    const Device device = dispatch_device("layer_norm backward", {&dy, &x, &weight});
    if (device.is_cuda()) {
      const cuda::Context& cu = cuda_context("layer_norm backward", device);
      if (x.dtype() == DType::F32) {
        cuda::layer_norm_backward(cu, dx.defined() ? dx.data<float>() : nullptr, dw_ptr, db_ptr, dy.data<float>(),
                                  x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), rows,
                                  C);
      } else {
        cuda::layer_norm_backward(cu, dx.defined() ? dx.data<bf16>() : nullptr, dw_ptr, db_ptr, dy.data<bf16>(),
                                  x.data<bf16>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), rows,
                                  C);
      }
    } else if (x.dtype() == DType::F32) {
      cpu::layer_norm_backward(dx.defined() ? dx.data<float>() : nullptr, dw_ptr, db_ptr, dy.data<float>(),
                               x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), rows, C);
    } else {
      cpu::layer_norm_backward(dx.defined() ? dx.data<bf16>() : nullptr, dw_ptr, db_ptr, dy.data<bf16>(),
                               x.data<bf16>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), rows, C);
    }
    return TensorList{dx, dw, db};
  });
  return y;
}

}  // namespace loom::ops
