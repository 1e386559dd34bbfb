// Mixture-of-experts ops: validation, the CPU kernel calls and the recorded backward.
// Kernels, the dispatch layout and why results do not depend on the thread count: backends/cpu/moe.h.
// The design (routing, dispatch/combine, backward, what is saved): docs/moe.md.
//
// Saved for backward:
//   moe_route        affinity [N,E] (its own output, detached), expert_index [N,K]
//   moe_experts      x, gates and the weights (the caller's tensors, or their bf16 copies under
//                    MatmulPrecision::BF16, as ops::linear), the dispatch (3 int arrays of N*K), and
//                    the pre-activations h1 = w1 x, h3 = w3 x: [N*K, F] f32 each. Not the SwiGLU output,
//                    not the expert outputs: the backward recomputes silu(h1)*h3 on the fly and gets the
//                    gate gradient as <dy w2, silu(h1)*h3> without them.
//   moe_sequence_balance_loss  affinity, f [B,E]
#include "ops/moe.h"

#include <cmath>
#include <limits>
#include <memory>

#include "backends/backend.h"
#include "backends/cpu/moe.h"
#include "backends/cuda/moe.h"
#include "backends/cuda/moe_route.h"
#include "core/autograd.h"

namespace loom::ops {
namespace {

void check_float(const Tensor& t, const char* op, const char* arg) {
  LOOM_CHECK(t.defined(), op, ": ", arg, " is undefined");
  LOOM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, op, ": ", arg, " must be f32 or bf16, got ",
             t.describe());
}

// Every expert_index value in [0, E); names the first one that is not.
void check_expert_index(const Tensor& index, int64_t E, const char* op) {
  const int32_t* p = index.data<int32_t>();
  const int64_t K = index.size(1);
  for (int64_t i = 0; i < index.numel(); ++i) {
    LOOM_CHECK(p[i] >= 0 && p[i] < E, op, ": expert_index[", i / K, ", ", i % K, "] = ", p[i],
               " is out of range for E=", E, " experts");
  }
}

Tensor grad_as(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

// moe_experts on CUDA (arguments validated, the dispatch built, y/h1/h3 allocated on the device): the
// dispatch's permutations go to the device, then the same forward and backward as on the CPU.
Tensor moe_experts_cuda(Device device, const std::shared_ptr<const MoeDispatch>& dispatch, const Tensor& x,
                        const Tensor& xo, const Tensor& gates, const Tensor& w1, const Tensor& w3, const Tensor& w2,
                        const Tensor& w1o, const Tensor& w3o, const Tensor& w2o, bool bf16_ops, Tensor y,
                        const Tensor& h1, const Tensor& h3, bool recording, int64_t C, int64_t F) {
  const char* op = "moe_experts";
  const int64_t N = dispatch->N, K = dispatch->K, E = dispatch->E;
  auto to_device = [&](const std::vector<int32_t>& v) {
    return Tensor::from_vector<int32_t>({static_cast<int64_t>(v.size())}, v).to(device);
  };
  const Tensor slot_of_row = to_device(dispatch->slot_of_row), row_of_slot = to_device(dispatch->row_of_slot);
  const cuda::MoeDeviceDispatch d{dispatch.get(), slot_of_row.data<int32_t>(), row_of_slot.data<int32_t>()};
  float* ph1 = recording ? h1.data<float>() : nullptr;
  float* ph3 = recording ? h3.data<float>() : nullptr;
  const cuda::Context& cu = cuda_context(op, device);
  if (bf16_ops) {
    cuda::moe_experts_forward(cu, d, xo.data<bf16>(), gates.data<float>(), w1o.data<bf16>(), w3o.data<bf16>(),
                              w2o.data<bf16>(), C, F, y.data<float>(), ph1, ph3);
  } else {
    cuda::moe_experts_forward(cu, d, xo.data<float>(), gates.data<float>(), w1o.data<float>(), w3o.data<float>(),
                              w2o.data<float>(), C, F, y.data<float>(), ph1, ph3);
  }
  if (x.dtype() == DType::BF16) return y.to(DType::BF16);  // not recorded (checked by the caller)
  autograd::record(
      op, {x, gates, w1, w3, w2}, {y},
      [xo, gates, w1o, w3o, w2o, dispatch, slot_of_row, row_of_slot, h1, h3, bf16_ops, N, K, C, F,
       E](const autograd::BackwardContext& ctx) {
        const Tensor& dy = ctx.grad_output(0);  // [N,C] f32
        const Device device = dispatch_device("moe_experts backward", {&dy, &xo});
        auto grad = [&](int i, const Shape& shape) {
          return ctx.needs_input_grad(i) ? Tensor::empty(shape, DType::F32, device) : Tensor();
        };
        Tensor dx = grad(0, Shape{N, C}), dgates = grad(1, Shape{N, K});
        Tensor dw1 = grad(2, Shape{E, F, C}), dw3 = grad(3, Shape{E, F, C}), dw2 = grad(4, Shape{E, C, F});
        auto ptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
        const cuda::MoeDeviceDispatch d{dispatch.get(), slot_of_row.data<int32_t>(), row_of_slot.data<int32_t>()};
        const cuda::Context& cu = cuda_context("moe_experts backward", device);
        if (bf16_ops) {
          cuda::moe_experts_backward(cu, d, dy.data<float>(), xo.data<bf16>(), gates.data<float>(), w1o.data<bf16>(),
                                     w3o.data<bf16>(), w2o.data<bf16>(), h1.data<float>(), h3.data<float>(), C, F,
                                     ptr(dx), ptr(dgates), ptr(dw1), ptr(dw3), ptr(dw2));
        } else {
          cuda::moe_experts_backward(cu, d, dy.data<float>(), xo.data<float>(), gates.data<float>(),
                                     w1o.data<float>(), w3o.data<float>(), w2o.data<float>(), h1.data<float>(),
                                     h3.data<float>(), C, F, ptr(dx), ptr(dgates), ptr(dw1), ptr(dw3), ptr(dw2));
        }
        return TensorList{dx, dgates, dw1, dw3, dw2};
      });
  return y;
}

}  // namespace

// ---- routing -------------------------------------------------------------------------------------

MoeRouting moe_route(const Tensor& logits, const Tensor& bias, int64_t top_k, float route_scale) {
  check_float(logits, "moe_route", "logits");
  LOOM_CHECK(logits.ndim() == 2, "moe_route: logits must be [N, E], got ", logits.describe());
  const int64_t N = logits.size(0), E = logits.size(1);
  LOOM_CHECK(E >= 1, "moe_route: logits has E=0 experts (shape ", logits.shape(), ")");
  LOOM_CHECK(bias.defined(), "moe_route: bias is undefined (pass zeros for no bias)");
  check_dtype(bias, DType::F32, "moe_route", "bias");
  LOOM_CHECK(bias.ndim() == 1 && bias.size(0) == E, "moe_route: bias has shape ", bias.shape(), " but logits has E=", E,
             " experts");
  LOOM_CHECK(top_k >= 1 && top_k <= E, "moe_route: top_k=", top_k, " must be in [1, E] with E=", E, " experts");
  LOOM_CHECK(std::isfinite(route_scale) && route_scale > 0.0f, "moe_route: route_scale must be finite and > 0, got ",
             route_scale);
  // The bias (E floats of model state) may stay on the CPU while the logits are on a GPU: a model whose
  // parameters alone were moved routes the same way.
  const Device device = dispatch_device("moe_route", {&logits});
  LOOM_CHECK(bias.device().is_cpu() || bias.device() == device, "moe_route: bias is on ", bias.device(),
             " but logits are on ", device, " (the bias may be on the CPU or on the logits' device)");
  {
    // On CUDA the check reads a host copy of a device bias (a small read-back: not capturable yet).
    const Tensor host_bias = bias.device().is_cpu() ? bias : bias.to(Device::cpu());
    const float* pb = host_bias.data<float>();
    for (int64_t e = 0; e < E; ++e) {
      LOOM_CHECK(std::isfinite(pb[e]), "moe_route: bias[", e, "] = ", pb[e], " is not finite");
    }
  }
  const Tensor device_bias = bias.device() == device ? bias : bias.to(device);
  const float* pb = device_bias.data<float>();

  MoeRouting r;
  r.expert_index = Tensor::empty(Shape{N, top_k}, DType::I32, logits.device());
  r.gates = Tensor::empty(Shape{N, top_k}, DType::F32, logits.device());
  r.affinity = Tensor::empty(Shape{N, E}, DType::F32, logits.device());
  r.expert_load = Tensor::empty(Shape{E}, DType::I32, logits.device());
  if (device.is_cuda()) {
    const cuda::Context& cu = cuda_context("moe_route", device);
    if (logits.dtype() == DType::F32) {
      cuda::moe_route_forward(cu, logits.data<float>(), pb, N, E, top_k, route_scale, r.expert_index.data<int32_t>(),
                              r.gates.data<float>(), r.affinity.data<float>(), r.expert_load.data<int32_t>());
    } else {
      cuda::moe_route_forward(cu, logits.data<bf16>(), pb, N, E, top_k, route_scale, r.expert_index.data<int32_t>(),
                              r.gates.data<float>(), r.affinity.data<float>(), r.expert_load.data<int32_t>());
    }
  } else if (logits.dtype() == DType::F32) {
    cpu::moe_route_forward(logits.data<float>(), pb, N, E, top_k, route_scale, r.expert_index.data<int32_t>(),
                           r.gates.data<float>(), r.affinity.data<float>(), r.expert_load.data<int32_t>());
  } else {
    cpu::moe_route_forward(logits.data<bf16>(), pb, N, E, top_k, route_scale, r.expert_index.data<int32_t>(),
                           r.gates.data<float>(), r.affinity.data<float>(), r.expert_load.data<int32_t>());
  }
  auto backward = [affinity = r.affinity.detach(), index = r.expert_index, dtype = logits.dtype(), N, E, top_k,
                   route_scale](const autograd::BackwardContext& ctx) {
    // A missing output gradient arrives as zeros; the kernel reads both in f32.
    const Tensor dg = grad_as(ctx.grad_output(0), DType::F32);  // [N,K]
    const Tensor da = grad_as(ctx.grad_output(1), DType::F32);  // [N,E]
    Tensor dlogits = Tensor::empty(Shape{N, E}, dtype, affinity.device());
    const Device device = dispatch_device("moe_route backward", {&dg, &da, &affinity});
    auto run = [&](auto* out) {
      if (device.is_cuda()) {
        cuda::moe_route_backward(cuda_context("moe_route backward", device), out, dg.data<float>(), da.data<float>(),
                                 affinity.data<float>(), index.data<int32_t>(), N, E, top_k, route_scale);
      } else {
        cpu::moe_route_backward(out, dg.data<float>(), da.data<float>(), affinity.data<float>(),
                                index.data<int32_t>(), N, E, top_k, route_scale);
      }
    };
    if (dtype == DType::F32) {
      run(dlogits.data<float>());
    } else {
      run(dlogits.data<bf16>());
    }
    return TensorList{dlogits};
  };
  // The bias is not an input: it selects, and selection has no gradient.
  autograd::record("moe_route", {logits}, {r.gates, r.affinity}, backward);
  return r;
}

// ---- routed experts ------------------------------------------------------------------------------

Tensor moe_experts(const Tensor& x, const Tensor& expert_index, const Tensor& gates, const Tensor& w1, const Tensor& w3,
                   const Tensor& w2, MatmulPrecision precision) {
  const char* op = "moe_experts";
  check_float(x, op, "x");
  LOOM_CHECK(x.ndim() == 2, op, ": x must be [N, C], got ", x.describe());
  const int64_t N = x.size(0), C = x.size(1);
  LOOM_CHECK(expert_index.defined(), op, ": expert_index is undefined");
  check_dtype(expert_index, DType::I32, op, "expert_index");
  LOOM_CHECK(expert_index.ndim() == 2 && expert_index.size(0) == N, op, ": expert_index has shape ",
             expert_index.shape(), " but x has N=", N, " tokens (expected [N, K])");
  const int64_t K = expert_index.size(1);
  LOOM_CHECK(K >= 1, op, ": expert_index has K=0 experts per token (shape ", expert_index.shape(), ")");
  LOOM_CHECK(gates.defined(), op, ": gates is undefined");
  check_dtype(gates, DType::F32, op, "gates");
  LOOM_CHECK(gates.shape() == expert_index.shape(), op, ": gates has shape ", gates.shape(),
             " but expert_index has shape ", expert_index.shape());
  for (const auto& [w, name] : {std::pair{&w1, "w1"}, std::pair{&w3, "w3"}, std::pair{&w2, "w2"}}) {
    check_float(*w, op, name);
    LOOM_CHECK(w->dtype() == x.dtype(), op, ": ", name, " is ", w->describe(), " but x is ", x.describe(),
               " (dtypes must match; use MatmulPrecision::BF16 for bf16 arithmetic on f32 tensors)");
    LOOM_CHECK(w->ndim() == 3, op, ": ", name, " must be 3-D ([E, F, C] for w1/w3, [E, C, F] for w2), got ",
               w->describe());
  }
  const int64_t E = w1.size(0), F = w1.size(1);
  LOOM_CHECK(w1.size(2) == C, op, ": w1 has shape ", w1.shape(), " but x has C=", C, " (expected [E, F, C])");
  LOOM_CHECK(E >= 1 && F >= 1 && C >= 1, op, ": empty expert dimensions: x ", x.shape(), ", w1 ", w1.shape());
  LOOM_CHECK(w3.shape() == w1.shape(), op, ": w3 has shape ", w3.shape(), " but w1 has shape ", w1.shape());
  LOOM_CHECK(w2.shape() == Shape({E, C, F}), op, ": w2 has shape ", w2.shape(), " but expected [E, C, F] = [", E, ", ",
             C, ", ", F, "] from w1 ", w1.shape());
  // The dispatch indexes slots with int32 (half the memory of int64 for the permutation arrays).
  LOOM_CHECK(N * K <= std::numeric_limits<int32_t>::max(), op, ": N=", N, " tokens * K=", K,
             " slots exceed the int32 slot index; split the batch");
  for (const Tensor* t : {&expert_index, &gates, &w1, &w3, &w2}) check_same_device(x, *t, op);
  const Device device = dispatch_device(op, {&x, &expert_index, &gates, &w1, &w3, &w2});
  // The dispatch (a counting sort) is built on the host; on CUDA from a copy of the index (a read-back:
  // the routed experts are not capturable into a CUDA graph yet), its permutations copied back.
  const Tensor index_host = device.is_cuda() ? expert_index.to(Device::cpu()) : expert_index;
  check_expert_index(index_host, E, op);

  const bool recording = autograd::any_requires_grad({x, gates, w1, w3, w2});
  LOOM_CHECK(x.dtype() == DType::F32 || !recording, op,
             ": backward through bf16 inputs is not supported; use f32 tensors with MatmulPrecision::BF16, or "
             "run it under NoGradGuard");
  // The GEMM operands: bf16 copies under mixed precision (as ops::linear), else the tensors themselves.
  const bool bf16_ops = x.dtype() == DType::BF16 || precision == MatmulPrecision::BF16;
  auto operand = [&](const Tensor& t) { return bf16_ops && t.dtype() != DType::BF16 ? t.to(DType::BF16) : t; };
  const Tensor xo = operand(x), w1o = operand(w1), w3o = operand(w3), w2o = operand(w2);

  auto dispatch = std::make_shared<const MoeDispatch>(moe_dispatch(index_host.data<int32_t>(), N, K, E));
  Tensor y = Tensor::empty(Shape{N, C}, DType::F32, x.device());
  Tensor h1 = recording ? Tensor::empty(Shape{N * K, F}, DType::F32, x.device()) : Tensor();
  Tensor h3 = recording ? Tensor::empty(Shape{N * K, F}, DType::F32, x.device()) : Tensor();
  float* ph1 = recording ? h1.data<float>() : nullptr;
  float* ph3 = recording ? h3.data<float>() : nullptr;
  if (device.is_cuda()) {
    return moe_experts_cuda(device, dispatch, x, xo, gates, w1, w3, w2, w1o, w3o, w2o, bf16_ops, y, h1, h3, recording,
                            C, F);
  }
  if (bf16_ops) {
    cpu::moe_experts_forward(*dispatch, xo.data<bf16>(), gates.data<float>(), w1o.data<bf16>(), w3o.data<bf16>(),
                             w2o.data<bf16>(), C, F, y.data<float>(), ph1, ph3);
  } else {
    cpu::moe_experts_forward(*dispatch, xo.data<float>(), gates.data<float>(), w1o.data<float>(), w3o.data<float>(),
                             w2o.data<float>(), C, F, y.data<float>(), ph1, ph3);
  }
  if (x.dtype() == DType::BF16) return y.to(DType::BF16);  // not recorded (checked above)

  autograd::record(
      op, {x, gates, w1, w3, w2}, {y},
      [xo, gates, w1o, w3o, w2o, dispatch, h1, h3, bf16_ops, N, K, C, F, E](const autograd::BackwardContext& ctx) {
        const Tensor& dy = ctx.grad_output(0);  // [N,C] f32
        auto grad = [&](int i, const Shape& shape) {
          return ctx.needs_input_grad(i) ? Tensor::empty(shape, DType::F32, dy.device()) : Tensor();
        };
        Tensor dx = grad(0, Shape{N, C}), dgates = grad(1, Shape{N, K});
        Tensor dw1 = grad(2, Shape{E, F, C}), dw3 = grad(3, Shape{E, F, C}), dw2 = grad(4, Shape{E, C, F});
        auto ptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
        if (bf16_ops) {
          cpu::moe_experts_backward(*dispatch, dy.data<float>(), xo.data<bf16>(), gates.data<float>(), w1o.data<bf16>(),
                                    w3o.data<bf16>(), w2o.data<bf16>(), h1.data<float>(), h3.data<float>(), C, F,
                                    ptr(dx), ptr(dgates), ptr(dw1), ptr(dw3), ptr(dw2));
        } else {
          cpu::moe_experts_backward(*dispatch, dy.data<float>(), xo.data<float>(), gates.data<float>(),
                                    w1o.data<float>(), w3o.data<float>(), w2o.data<float>(), h1.data<float>(),
                                    h3.data<float>(), C, F, ptr(dx), ptr(dgates), ptr(dw1), ptr(dw3), ptr(dw2));
        }
        return TensorList{dx, dgates, dw1, dw3, dw2};
      });
  return y;
}

// ---- sequence-wise balance loss ------------------------------------------------------------------

Tensor moe_sequence_balance_loss(const MoeRouting& routing, int64_t batch, int64_t seq, float alpha) {
  const char* op = "moe_sequence_balance_loss";
  const Tensor& affinity = routing.affinity;
  const Tensor& index = routing.expert_index;
  LOOM_CHECK(affinity.defined() && index.defined(), op,
             ": routing.affinity and routing.expert_index must be defined (a MoeRouting from moe_route)");
  check_dtype(affinity, DType::F32, op, "routing.affinity");
  check_dtype(index, DType::I32, op, "routing.expert_index");
  LOOM_CHECK(affinity.ndim() == 2 && index.ndim() == 2 && index.size(0) == affinity.size(0), op,
             ": routing.affinity has shape ", affinity.shape(), " and routing.expert_index has shape ", index.shape(),
             " (expected [N, E] and [N, K])");
  const int64_t N = affinity.size(0), E = affinity.size(1), K = index.size(1);
  LOOM_CHECK(E >= 1 && K >= 1 && K <= E, op, ": K=", K, " experts per token with E=", E, " experts");
  LOOM_CHECK(batch >= 1 && seq >= 1, op, ": batch=", batch, " and seq=", seq, " must both be >= 1");
  LOOM_CHECK(batch * seq == N, op, ": batch=", batch, " * seq=", seq, " = ", batch * seq, " but the routing has N=", N,
             " tokens");
  LOOM_CHECK(std::isfinite(alpha), op, ": alpha must be finite, got ", alpha);
  check_same_device(affinity, index, op);
  const Device device = dispatch_device(op, {&affinity, &index});
  // On CUDA the check reads a host copy of the index (as moe_experts' dispatch does: not capturable yet).
  check_expert_index(device.is_cuda() ? index.to(Device::cpu()) : index, E, op);

  Tensor f = Tensor::empty(Shape{batch, E}, DType::F32, affinity.device());
  Tensor loss = Tensor::empty(Shape{}, DType::F32, affinity.device());
  if (device.is_cuda()) {
    // Scratch: N per-token affinity sums and B*E loss terms, in double (as the CPU's).
    Tensor scratch = Tensor::empty(Shape{2 * (N + batch * E)}, DType::F32, device);
    cuda::moe_balance_loss_forward(cuda_context(op, device), affinity.data<float>(), index.data<int32_t>(), batch, seq,
                                   E, K, alpha, f.data<float>(), loss.data<float>(),
                                   reinterpret_cast<double*>(scratch.data<float>()));
    autograd::record(op, {affinity}, {loss}, [affinity, f, batch, seq, E, alpha](const autograd::BackwardContext& ctx) {
      const char* bop = "moe_sequence_balance_loss backward";
      const Tensor& dloss = ctx.grad_output(0);  // read on the device
      check_dtype(dloss, DType::F32, bop, "grad");
      const Device device = dispatch_device(bop, {&dloss, &affinity});
      Tensor da = Tensor::empty(affinity.shape(), DType::F32, device);
      cuda::moe_balance_loss_backward(cuda_context(bop, device), da.data<float>(), dloss.data<float>(),
                                      affinity.data<float>(), f.data<float>(), batch, seq, E, alpha);
      return TensorList{da};
    });
    return loss;
  }
  loss.data<float>()[0] = cpu::moe_balance_loss_forward(affinity.data<float>(), index.data<int32_t>(), batch, seq, E, K,
                                                        alpha, f.data<float>());
  // Only the affinities are an input: f counts choices, which have no gradient.
  autograd::record(op, {affinity}, {loss}, [affinity, f, batch, seq, E, alpha](const autograd::BackwardContext& ctx) {
    const float dloss = ctx.grad_output(0).item();
    Tensor da = Tensor::empty(affinity.shape(), DType::F32, affinity.device());
    cpu::moe_balance_loss_backward(da.data<float>(), dloss, affinity.data<float>(), f.data<float>(), batch, seq, E,
                                   alpha);
    return TensorList{da};
  });
  return loss;
}

// ---- aux-loss-free bias update -------------------------------------------------------------------

void moe_update_bias_(Tensor& bias, const Tensor& expert_load, float gamma) {
  const char* op = "moe_update_bias_";
  LOOM_CHECK(bias.defined() && expert_load.defined(), op, ": bias and expert_load must be defined");
  check_dtype(bias, DType::F32, op, "bias");
  check_dtype(expert_load, DType::I32, op, "expert_load");
  LOOM_CHECK(bias.ndim() == 1 && expert_load.shape() == bias.shape(), op, ": bias has shape ", bias.shape(),
             " but expert_load has shape ", expert_load.shape(), " (both [E])");
  LOOM_CHECK(std::isfinite(gamma) && gamma >= 0.0f, op, ": gamma must be finite and >= 0, got ", gamma);
  check_same_device(bias, expert_load, op);
  const Device device = dispatch_device(op, {&bias, &expert_load});
  const int64_t E = bias.size(0);
  // On CUDA the check reads a host copy of the E counts; the update runs on the device.
  const Tensor host_load = device.is_cuda() ? expert_load.to(Device::cpu()) : expert_load;
  const int32_t* load = host_load.data<int32_t>();
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    LOOM_CHECK(load[e] >= 0, op, ": expert_load[", e, "] = ", load[e], " is negative");
    total += load[e];
  }
  if (device.is_cuda()) {
    cuda::moe_update_bias(cuda_context(op, device), bias.data<float>(), expert_load.data<int32_t>(), E, gamma);
    return;
  }
  float* b = bias.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    // sign(mean - load[e]) = sign(total - E * load[e]), in integers.
    const int64_t diff = total - E * static_cast<int64_t>(load[e]);
    b[e] += diff > 0 ? gamma : diff < 0 ? -gamma : 0.0f;
  }
}

}  // namespace loom::ops
