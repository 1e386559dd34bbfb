// The functional ops: the same semantics as src/ops/*, on numpy arrays. Shapes follow the C++
// contracts; python/loom/functional.py converts dtypes and broadcasts masks/positions first.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "convert.h"
#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/softmax.h"

namespace loom::python {

namespace {

ops::RopeStyle rope_style(const std::string& name) {
  if (name == "interleaved") return ops::RopeStyle::Interleaved;
  if (name == "rotate_half") return ops::RopeStyle::RotateHalf;
  LOOM_FAIL("rope: style must be \"interleaved\" or \"rotate_half\", got \"", name, "\"");
}

// Runs an op on tensors without the GIL and without recording autodiff nodes.
template <typename Fn>
nb::object run_op(Fn&& fn) {
  Tensor y = without_gil([&] {
    autograd::NoGradGuard no_grad;
    return fn();
  });
  return to_numpy(y);
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def("linear", [](In<float> x, In<float> w) {
    Tensor tx = to_tensor(x), tw = to_tensor(w);
    return run_op([&] { return ops::linear(tx, tw); });
  });
  m.def("embedding", [](In<int32_t> ids, In<float> table) {
    Tensor ti = to_tensor(ids), tt = to_tensor(table);
    return run_op([&] { return ops::embedding(ti, tt); });
  });
  m.def("silu", [](In<float> x) {
    Tensor tx = to_tensor(x);
    return run_op([&] { return ops::silu(tx); });
  });
  m.def("softmax", [](In<float> x, int dim) {
    Tensor tx = to_tensor(x);
    return run_op([&] { return ops::softmax(tx, dim); });
  });
  m.def("rms_norm", [](In<float> x, In<float> weight, float eps) {
    Tensor tx = to_tensor(x), tw = to_tensor(weight);
    return run_op([&] { return ops::rms_norm(tx, tw, eps); });
  });
  // w2(silu(x w1^T) * (x w3^T)); w1, w3: [F, C], w2: [C, F].
  m.def("swiglu", [](In<float> x, In<float> w1, In<float> w2, In<float> w3) {
    Tensor tx = to_tensor(x), t1 = to_tensor(w1), t2 = to_tensor(w2), t3 = to_tensor(w3);
    return run_op([&] { return ops::linear(ops::swiglu(ops::linear(tx, t1), ops::linear(tx, t3)), t2); });
  });
  m.def(
      "scaled_dot_product_attention",
      [](In<float> q, In<float> k, In<float> v, std::optional<In<bool>> mask, bool causal) {
        Tensor tq = to_tensor(q), tk = to_tensor(k), tv = to_tensor(v);
        Tensor tm = mask ? to_tensor(*mask) : Tensor();
        return run_op([&] { return ops::scaled_dot_product_attention(tq, tk, tv, tm, causal); });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(), nb::arg("causal"));
  m.def("rope", [](In<float> x, In<int32_t> positions, float theta, const std::string& style) {
    Tensor tx = to_tensor(x), tp = to_tensor(positions);
    auto s = rope_style(style);
    return run_op([&] { return ops::rope(tx, tp, theta, s); });
  });
  // Causal multi-head self-attention from the four projections ([C, C] each, [out, in]).
  // x: [B, T, C]; positions: i32 [T] or [B, T], used only with rope_theta.
  m.def(
      "multihead_self_attention",
      [](In<float> x, In<float> wq, In<float> wk, In<float> wv, In<float> wo, int num_heads,
         std::optional<float> rope_theta, std::optional<In<int32_t>> positions) {
        Tensor tx = to_tensor(x), q = to_tensor(wq), k = to_tensor(wk), v = to_tensor(wv), o = to_tensor(wo);
        Tensor tp = positions ? to_tensor(*positions) : Tensor();
        return run_op([&] {
          check_ndim(tx, 3, "multihead_self_attention", "x");
          LOOM_CHECK(num_heads > 0, "multihead_self_attention: num_heads must be positive, got ", num_heads);
          std::optional<ops::RopeOptions> rope;
          if (rope_theta) {
            LOOM_CHECK(tp.defined(), "multihead_self_attention: rope_theta needs positions");
            rope = ops::RopeOptions{tp, *rope_theta, ops::RopeStyle::Interleaved, {}};
          }
          Tensor attn = ops::causal_self_attention(ops::linear(tx, q), ops::linear(tx, k), ops::linear(tx, v),
                                                   num_heads, rope);
          return ops::linear(attn, o);
        });
      },
      nb::arg("x"), nb::arg("wq"), nb::arg("wk"), nb::arg("wv"), nb::arg("wo"), nb::arg("num_heads"),
      nb::arg("rope_theta").none(), nb::arg("positions").none());
  m.def("cross_entropy", [](In<float> logits, In<int32_t> targets, int32_t ignore_index) {
    Tensor tl = to_tensor(logits), tt = to_tensor(targets);
    return without_gil([&] {
      autograd::NoGradGuard no_grad;
      return ops::cross_entropy(tl, tt, ignore_index).item();
    });
  });
}

}  // namespace loom::python
