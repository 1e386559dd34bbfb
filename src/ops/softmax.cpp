#include "ops/softmax.h"

#include "backends/backend.h"
#include "backends/cpu/softmax.h"
#include "backends/cuda/softmax.h"
#include "core/autograd.h"

namespace loom::ops {

Tensor softmax(const Tensor& x, int dim) {
  check_dtype(x, DType::F32, "softmax", "x");
  const Device device = dispatch_device("softmax", {&x});
  const int nd = x.ndim();
  LOOM_CHECK(nd >= 1, "softmax: x must have at least one dimension, got ", x.describe());
  LOOM_CHECK(dim >= -nd && dim < nd, "softmax: dim ", dim, " is out of range for ", x.describe());
  const int d = dim < 0 ? dim + nd : dim;
  const int64_t outer = x.shape().numel_before(d);
  const int64_t n = x.size(d);
  const int64_t inner = n == 0 || outer == 0 ? 0 : x.numel() / (outer * n);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  if (device.is_cuda()) {
    cuda::softmax_forward(cuda_context("softmax", device), y.data<float>(), x.data<float>(), outer, n, inner);
  } else {
    cpu::softmax_forward(y.data<float>(), x.data<float>(), outer, n, inner);
  }
  // y is saved detached: capturing the output itself would make it own its own grad_fn (a cycle).
  autograd::record("softmax", {x}, {y}, [saved = y.detach(), outer, n, inner](const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);
    const Device device = dispatch_device("softmax backward", {&dy, &saved});
    Tensor dx = Tensor::empty(saved.shape(), DType::F32, saved.device());
    if (device.is_cuda()) {
      cuda::softmax_backward(cuda_context("softmax backward", device), dx.data<float>(), saved.data<float>(),
                             dy.data<float>(), outer, n, inner);
    } else {
      cpu::softmax_backward(dx.data<float>(), saved.data<float>(), dy.data<float>(), outer, n, inner);
    }
    return TensorList{dx};
  });
  return y;
}

}  // namespace loom::ops
