// Activations, SwiGLU and dropout: validation, CPU dispatch, and the recorded backward.
//
// silu/gelu/swiglu save their inputs and recompute sigmoid/erf in the backward (one fused pass each,
// cheaper than storing and re-reading an intermediate). Dropout saves nothing: its backward regenerates
// the mask from (key, index), so the gradient uses exactly the forward's mask.
// All accept f32 or bf16 (bf16: f32 math inside, bf16 results).
#include "ops/activation.h"

#include <cmath>

#include "backends/backend.h"
#include "backends/cpu/activation.h"
#include "backends/cuda/activation.h"
#include "core/autograd.h"

namespace loom::ops {
namespace {

// Every activation has CUDA kernels: the device is checked (usable, errors naming the op) by the ops.
void check_float_input(const Tensor& t, const char* op, const char* arg) {
  LOOM_CHECK(t.defined(), op, ": ", arg, " is undefined");
  LOOM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, op, ": ", arg, " must be f32 or bf16, got ",
             t.describe());
}

// The CUDA context when t is on a GPU, else null (the CPU kernels run).
const cuda::Context* gpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = dispatch_device(op, tensors);
  return device.is_cuda() ? &cuda_context(op, device) : nullptr;
}

// Calls fn(T{}) with T = float or bf16 according to the dtype (already checked to be one of them).
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  if (dtype == DType::F32) {
    fn(float{});
  } else {
    fn(bf16{});
  }
}

Tensor grad_as(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

// y's dtype: x's, or bf16 for an f32 x (mixed precision, CPU kernels only).
DType output_dtype(const Tensor& x, std::optional<DType> y_dtype, const char* op) {
  const DType y = y_dtype.value_or(x.dtype());
  LOOM_CHECK(y == x.dtype() || (x.dtype() == DType::F32 && y == DType::BF16), op, ": y_dtype ", y, " for ",
             x.describe(), ": y has the input's dtype, or is bf16 for an f32 input");
  LOOM_CHECK(y == x.dtype() || x.device().is_cpu(), op,
             ": an f32 input with a bf16 y runs on the CPU only so far, got ", x.describe());
  return y;
}

}  // namespace

Tensor silu(const Tensor& x) {
  check_float_input(x, "silu", "x");
  const cuda::Context* cu = gpu("silu", {&x});
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (cu != nullptr) {
      cuda::silu_forward(*cu, y.data<T>(), x.data<T>(), x.numel());
    } else {
      cpu::silu_forward(y.data<T>(), x.data<T>(), x.numel());
    }
  });
  autograd::record("silu", {x}, {y}, [x](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), x.dtype());
    const cuda::Context* cu = gpu("silu backward", {&dy, &x});
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (cu != nullptr) {
        cuda::silu_backward(*cu, dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
      } else {
        cpu::silu_backward(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
      }
    });
    return TensorList{dx};
  });
  return y;
}

Tensor gelu(const Tensor& x, GeluApproximation approx, std::optional<DType> y_dtype) {
  check_float_input(x, "gelu", "x");
  const bool tanh_approx = approx == GeluApproximation::Tanh;
  const DType ydt = output_dtype(x, y_dtype, "gelu");
  const cuda::Context* cu = gpu("gelu", {&x});
  Tensor y = Tensor::empty(x.shape(), ydt, x.device());
  if (ydt != x.dtype()) {
    cpu::gelu_forward(y.data<bf16>(), x.data<float>(), x.numel(), tanh_approx);  // mixed: f32 in, bf16 out
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (cu != nullptr) {
        cuda::gelu_forward(*cu, y.data<T>(), x.data<T>(), x.numel(), tanh_approx);
      } else {
        cpu::gelu_forward(y.data<T>(), x.data<T>(), x.numel(), tanh_approx);
      }
    });
  }
  autograd::record("gelu", {x}, {y}, [x, tanh_approx](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), x.dtype());
    const cuda::Context* cu = gpu("gelu backward", {&dy, &x});
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (cu != nullptr) {
        cuda::gelu_backward(*cu, dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel(), tanh_approx);
      } else {
        cpu::gelu_backward(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel(), tanh_approx);
      }
    });
    return TensorList{dx};
  });
  return y;
}

Tensor swiglu(const Tensor& gate, const Tensor& up, std::optional<DType> y_dtype) {
  check_float_input(gate, "swiglu", "gate");
  check_float_input(up, "swiglu", "up");
  LOOM_CHECK(gate.shape() == up.shape(), "swiglu: gate has shape ", gate.shape(), " but up has shape ",
             up.shape(), " (they must match)");
  LOOM_CHECK(gate.dtype() == up.dtype(), "swiglu: gate is ", gate.describe(), " but up is ", up.describe(),
             " (dtypes must match)");
  check_same_device(gate, up, "swiglu");
  const DType ydt = output_dtype(gate, y_dtype, "swiglu");
  const cuda::Context* cu = gpu("swiglu", {&gate, &up});
  Tensor y = Tensor::empty(gate.shape(), ydt, gate.device());
  if (ydt != gate.dtype()) {
    cpu::swiglu_forward(y.data<bf16>(), gate.data<float>(), up.data<float>(), gate.numel());  // mixed
  } else {
    dispatch_float(gate.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (cu != nullptr) {
        cuda::swiglu_forward(*cu, y.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
      } else {
        cpu::swiglu_forward(y.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
      }
    });
  }
  autograd::record("swiglu", {gate, up}, {y}, [gate, up](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), gate.dtype());
    Tensor dgate = ctx.needs_input_grad(0) ? Tensor::empty(gate.shape(), gate.dtype(), gate.device()) : Tensor();
    Tensor dup = ctx.needs_input_grad(1) ? Tensor::empty(up.shape(), up.dtype(), up.device()) : Tensor();
    const cuda::Context* cu = gpu("swiglu backward", {&dy, &gate, &up});
    dispatch_float(gate.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* pg = dgate.defined() ? dgate.data<T>() : nullptr;
      T* pu = dup.defined() ? dup.data<T>() : nullptr;
      if (cu != nullptr) {
        cuda::swiglu_backward(*cu, pg, pu, dy.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
      } else {
        cpu::swiglu_backward(pg, pu, dy.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
      }
    });
    return TensorList{dgate, dup};
  });
  return y;
}

Tensor dropout(const Tensor& x, float p, RngKey key, bool training) {
  LOOM_CHECK(x.defined(), "dropout: x is undefined");
  LOOM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "dropout: x must be f32 or bf16, got ",
             x.describe());
  const Device device = dispatch_device("dropout", {&x});  // dropout has CUDA kernels too
  LOOM_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got p=", p);
  // Identity: x itself (as torch.nn.functional.dropout), so nothing is copied or recorded.
  if (!training || p == 0.0f) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (device.is_cuda()) {
      cuda::dropout_forward(cuda_context("dropout", device), y.data<T>(), x.data<T>(), x.numel(), p, key);
    } else {
      cpu::dropout_forward(y.data<T>(), x.data<T>(), x.numel(), p, key);
    }
  });
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  autograd::record("dropout", {x}, {y}, [shape, dtype, device, p, key](const autograd::BackwardContext& ctx) {
    const Tensor dy = grad_as(ctx.grad_output(0), dtype);
    Tensor dx = Tensor::empty(shape, dtype, device);
    dispatch_float(dtype, [&](auto tag) {
      using T = decltype(tag);
      if (device.is_cuda()) {  // same mask and scale
        cuda::dropout_forward(cuda_context("dropout backward", device), dx.data<T>(), dy.data<T>(), dx.numel(), p, key);
      } else {
        cpu::dropout_forward(dx.data<T>(), dy.data<T>(), dx.numel(), p, key);  // same mask and scale
      }
    });
    return TensorList{dx};
  });
  return y;
}

}  // namespace loom::ops
