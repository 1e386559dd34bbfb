#include "ops/elementwise.h"

#include "backends/backend.h"
#include "backends/cpu/elementwise.h"
#include "backends/cuda/elementwise.h"
#include "core/autograd.h"
#include "core/hooks.h"

namespace loom::ops {
namespace {

void check_binary(const Tensor& a, const Tensor& b, const char* op) {
  check_dtype(a, DType::F32, op, "a");
  check_dtype(b, DType::F32, op, "b");
  LOOM_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.shape(), " vs ", b.shape());
  check_same_device(a, b, op);
}

// The CUDA context when the operands are on a GPU, else null (the CPU kernels run).
const cuda::Context* gpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = dispatch_device(op, tensors);
  return device.is_cuda() ? &cuda_context(op, device) : nullptr;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "add");
  const cuda::Context* cu = gpu("add", {&a, &b});  // before allocating, so errors name the op
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (cu != nullptr) {
    cuda::add_forward(*cu, out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  } else {
    cpu::add_forward(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  }
  autograd::record("add", {a, b}, {out}, [](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    return TensorList{g, g};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "sub");
  require_cpu("sub", {&a, &b});
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  cpu::axpby(out.data<float>(), 1.0f, a.data<float>(), -1.0f, b.data<float>(), a.numel());
  autograd::record("sub", {a, b}, {out}, [](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    return TensorList{g, ctx.needs_input_grad(1) ? scale(g, -1.0f) : Tensor()};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "mul");
  const cuda::Context* cu = gpu("mul", {&a, &b});  // before allocating, so errors name the op
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (cu != nullptr) {
    cuda::mul_forward(*cu, out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  } else {
    cpu::mul_forward(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  }
  autograd::record("mul", {a, b}, {out}, [a, b](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    return TensorList{ctx.needs_input_grad(0) ? mul(g, b) : Tensor(),
                      ctx.needs_input_grad(1) ? mul(g, a) : Tensor()};
  });
  return out;
}

Tensor scale(const Tensor& a, float s) {
  check_dtype(a, DType::F32, "scale", "a");
  const cuda::Context* cu = gpu("scale", {&a});  // before allocating, so errors name the op
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (cu != nullptr) {
    cuda::scale_forward(*cu, out.data<float>(), a.data<float>(), s, a.numel());
  } else {
    cpu::scale_forward(out.data<float>(), a.data<float>(), s, a.numel());
  }
  autograd::record("scale", {a}, {out}, [s](const autograd::BackwardContext& ctx) {
    return TensorList{scale(ctx.grad_output(0), s)};
  });
  return out;
}

Tensor sum(const Tensor& a) {
  check_dtype(a, DType::F32, "sum", "a");
  require_cpu("sum", {&a});
  Tensor out = Tensor::empty(Shape{}, DType::F32, a.device());
  *out.data<float>() = static_cast<float>(cpu::sum(a.data<float>(), a.numel()));
  Shape in_shape = a.shape();
  autograd::record("sum", {a}, {out}, [in_shape](const autograd::BackwardContext& ctx) {
    return TensorList{Tensor::full(in_shape, ctx.grad_output(0).item())};
  });
  return out;
}

Tensor mean(const Tensor& a) {
  LOOM_CHECK(a.numel() > 0, "mean of an empty tensor ", a.describe());
  return scale(sum(a), 1.0f / static_cast<float>(a.numel()));
}

void add_(Tensor& dst, const Tensor& src) {
  check_binary(dst, src, "add_");
  if (const cuda::Context* cu = gpu("add_", {&dst, &src})) {
    cuda::add_inplace(*cu, dst.data<float>(), src.data<float>(), dst.numel());
  } else {
    cpu::add_inplace(dst.data<float>(), src.data<float>(), dst.numel());
  }
}

void scale_(Tensor& a, float s) {
  check_dtype(a, DType::F32, "scale_", "a");
  if (const cuda::Context* cu = gpu("scale_", {&a})) {
    cuda::scale_forward(*cu, a.data<float>(), a.data<float>(), s, a.numel());
  } else {
    cpu::scale_forward(a.data<float>(), a.data<float>(), s, a.numel());
  }
}

void convert_(Tensor& dst, const Tensor& src) {
  LOOM_CHECK(dst.defined() && src.defined(), "convert_: dst ", dst.describe(), " and src ", src.describe(),
             " must be defined");
  LOOM_CHECK(dst.shape() == src.shape(), "convert_: dst has shape ", dst.shape(), " but src has ", src.shape());
  LOOM_CHECK(src.dtype() == DType::F32 && dst.dtype() == DType::BF16, "convert_: converts f32 into bf16, got src ",
             src.describe(), " and dst ", dst.describe());
  check_same_device(dst, src, "convert_");
  if (const cuda::Context* cu = gpu("convert_", {&dst, &src})) {
    cuda::convert_f32_to_bf16(*cu, dst.data<bf16>(), src.data<float>(), src.numel());
  } else {
    cpu::convert_f32_to_bf16(src.data<float>(), dst.data<bf16>(), src.numel());
  }
}

}  // namespace loom::ops

// The autodiff engine's gradient sums (core/hooks.h): the engine runs with gradients off, so nothing is
// recorded.
namespace loom::hooks {
Tensor add_gradients(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
void add_gradient_into(Tensor& dst, const Tensor& src) { ops::add_(dst, src); }
}  // namespace loom::hooks
