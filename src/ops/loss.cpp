// cross_entropy: validation and the fused forward/backward (kernels: backends/cpu/loss.*).
// Legend: N rows (the leading dimensions flattened), V classes.
//
// When autodiff records the op, the forward also writes the gradient (softmax - onehot) / count into a
// saved [N,V] buffer, reusing the exponentials it computes anyway; backward only rescales it by the
// upstream gradient (usually exactly 1, then it is returned as is). Under NoGradGuard nothing is saved.
//
// All targets ignored: the loss is 0 and the gradient is all zeros (PyTorch returns NaN here; a padded
// micro-batch with no real token should not poison a training run).
#include "ops/loss.h"

#include "backends/backend.h"
#include "backends/cpu/loss.h"
#include "core/autograd.h"

namespace loom::ops {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  LOOM_CHECK(logits.defined() && targets.defined(), "cross_entropy: logits and targets must be defined");
  check_dtype(logits, DType::F32, "cross_entropy", "logits");
  check_dtype(targets, DType::I32, "cross_entropy", "targets");
  LOOM_CHECK(logits.ndim() >= 1, "cross_entropy: logits must have a class dimension, got ", logits.describe());
  LOOM_CHECK(targets.shape() == logits.shape().drop_last(), "cross_entropy: targets have shape ",
             targets.shape(), " but logits ", logits.shape(), " need targets of shape ", logits.shape().drop_last());
  check_same_device(logits, targets, "cross_entropy");
  require_cpu("cross_entropy", {&logits, &targets});
  const int64_t V = logits.size(-1);
  const int64_t N = targets.numel();
  LOOM_CHECK(V > 0, "cross_entropy: logits have V=0 classes");

  const int32_t* pt = targets.data<int32_t>();
  int64_t bad = -1;
  const int64_t count = cpu::cross_entropy_count(pt, N, V, ignore_index, &bad);
  LOOM_CHECK(bad < 0, "cross_entropy: target ", (bad >= 0 ? pt[bad] : 0), " at flat position ", bad,
             " is outside [0, V) with V=", V, " and is not ignore_index=", ignore_index);

  const bool recording = autograd::any_requires_grad({logits});
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  Tensor grad = recording ? Tensor::empty(logits.shape(), DType::F32, logits.device()) : Tensor();
  const double total = cpu::cross_entropy_forward(logits.data<float>(), pt, N, V, ignore_index,
                                                  recording ? grad.data<float>() : nullptr, scale);
  Tensor loss = Tensor::empty(Shape{}, DType::F32, logits.device());
  *loss.data<float>() = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;

  autograd::record("cross_entropy", {logits, targets}, {loss}, [grad](const autograd::BackwardContext& ctx) {
    if (!ctx.needs_input_grad(0)) return TensorList{Tensor(), Tensor()};
    const float upstream = ctx.grad_output(0).item();
    if (upstream != 1.0f) cpu::scale_inplace(grad.data<float>(), upstream, grad.numel());
    return TensorList{grad, Tensor()};
  });
  return loss;
}

}  // namespace loom::ops
