// silu, gelu (erf and tanh), swiglu: PyTorch fixtures, the vectorised kernels against the std:: double
// oracles over a dense sweep, finite-difference gradchecks, bf16, and errors.
#include <cmath>
#include <functional>
#include <vector>

#include "backends/cpu/activation.h"
#include "support/norm_helpers.h"
#include "ops/activation.h"

using namespace loom;
using test::expect_error_mentions;

namespace {

void check_unary_fixture(const test::Fixture& fx, const std::string& name,
                         const std::function<Tensor(const Tensor&)>& op) {
  SCOPED_TRACE(name);
  Tensor x = test::param(fx.get(name + ".x"));
  Tensor y = op(x);
  // atol 1e-6: a few ulp of values near 1, where f32 erf/exp round; saturated tails are tiny.
  test::expect_close(y, fx.get(name + ".y"), 1e-6f, 4e-6f, name + " y");
  autograd::backward(y, fx.get(name + ".dy"));
  test::expect_close(x.grad(), fx.get(name + ".dx"), 1e-6f, 4e-6f, name + " dx");
}

// A dense sweep over [-lo, hi] plus saturated tails, for comparing kernels with their oracles.
Tensor sweep(int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  for (float t : {-1e30f, -100.0f, -88.0f, -87.0f, 87.0f, 88.0f, 100.0f, 1e30f}) v.push_back(t);
  return Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
}

}  // namespace

TEST(Activation, MatchesPyTorch) {
  auto fx = test::norm_fixture("activation.json");
  check_unary_fixture(fx, "silu", [](const Tensor& x) { return ops::silu(x); });
  check_unary_fixture(fx, "gelu", [](const Tensor& x) { return ops::gelu(x); });
  check_unary_fixture(fx, "gelu_c1", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::None); });
  check_unary_fixture(fx, "gelu_tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::Tanh); });
}

TEST(Swiglu, MatchesPyTorch) {
  auto fx = test::norm_fixture("activation.json");
  for (std::string name : {"swiglu", "swiglu_c7"}) {
    SCOPED_TRACE(name);
    Tensor gate = test::param(fx.get(name + ".gate")), up = test::param(fx.get(name + ".up"));
    Tensor y = ops::swiglu(gate, up);
    test::expect_close(y, fx.get(name + ".y"), 1e-6f, 4e-6f, "y");
    autograd::backward(y, fx.get(name + ".dy"));
    test::expect_close(gate.grad(), fx.get(name + ".dgate"), 1e-6f, 4e-6f, "dgate");
    test::expect_close(up.grad(), fx.get(name + ".dup"), 1e-6f, 4e-6f, "dup");
  }
}

// 200k points through the vectorised kernels (many full vectors, a tail, several parallel chunks).
TEST(Activation, FastKernelsMatchReferenceOverSweep) {
  Tensor x = sweep(200003, -30.0f, 30.0f);
  const int64_t n = x.numel();
  Tensor dy = test::randn({n}, 71);
  Tensor y = Tensor::empty({n}), y_ref = Tensor::empty({n}), dx = Tensor::empty({n}), dx_ref = Tensor::empty({n});
  cpu::silu_forward(y.data<float>(), x.data<float>(), n);
  cpu::silu_forward_reference(y_ref.data<float>(), x.data<float>(), n);
  test::expect_close(y, y_ref, 1e-30f, 1e-6f, "silu");  // sigmoid <= ~2.3 ulp
  cpu::silu_backward(dx.data<float>(), dy.data<float>(), x.data<float>(), n);
  cpu::silu_backward_reference(dx_ref.data<float>(), dy.data<float>(), x.data<float>(), n);
  test::expect_close(dx, dx_ref, 1e-6f, 2e-6f, "silu backward");
  for (bool tanh_approx : {false, true}) {
    SCOPED_TRACE(tanh_approx ? "gelu tanh" : "gelu erf");
    cpu::gelu_forward(y.data<float>(), x.data<float>(), n, tanh_approx);
    cpu::gelu_forward_reference(y_ref.data<float>(), x.data<float>(), n, tanh_approx);
    test::expect_close(y, y_ref, 1e-6f, 2e-6f, "gelu");
    cpu::gelu_backward(dx.data<float>(), dy.data<float>(), x.data<float>(), n, tanh_approx);
    cpu::gelu_backward_reference(dx_ref.data<float>(), dy.data<float>(), x.data<float>(), n, tanh_approx);
    test::expect_close(dx, dx_ref, 2e-6f, 4e-6f, "gelu backward");
  }
}

TEST(Activation, Gradcheck) {
  Tensor x = test::param(test::randn({3, 11}, 81, 2.0f));
  test::gradcheck([](const TensorList& in) { return ops::silu(in[0]); }, {x});
  test::gradcheck([](const TensorList& in) { return ops::gelu(in[0]); }, {x});
  test::gradcheck([](const TensorList& in) { return ops::gelu(in[0], ops::GeluApproximation::Tanh); }, {x});
  Tensor gate = test::param(test::randn({2, 3, 7}, 82, 2.0f)), up = test::param(test::randn({2, 3, 7}, 83));
  test::gradcheck([](const TensorList& in) { return ops::swiglu(in[0], in[1]); }, {gate, up});
}

TEST(Swiglu, EqualsSiluTimesUpAndPartialGradients) {
  Tensor gate = test::param(test::randn({4, 33}, 91, 2.0f)), up = test::randn({4, 33}, 92);
  Tensor y = ops::swiglu(gate, up);
  std::vector<float> s = ops::silu(gate.detach()).to_vector<float>(), u = up.to_vector<float>();
  std::vector<float> yv = y.to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], s[i] * u[i], 1e-6f * (1 + std::fabs(yv[i])));
  // Only gate requires grad: the backward computes dgate alone, with the same values (up to FMA
  // contraction, which the compiler may apply differently in the two loops).
  Tensor dy = test::randn({4, 33}, 93);
  autograd::backward(y, dy);
  Tensor gate2 = test::param(gate.detach()), up2 = test::param(up);
  autograd::backward(ops::swiglu(gate2, up2), dy);
  test::expect_close(gate.grad(), gate2.grad(), 1e-7f, 1e-6f, "dgate alone vs with dup");
  EXPECT_FALSE(up.grad().defined());
}

TEST(Activation, Bf16MatchesF32) {
  Tensor x32 = test::randn({5, 33}, 101, 3.0f).to(DType::BF16).to(DType::F32);
  Tensor up32 = test::randn({5, 33}, 102).to(DType::BF16).to(DType::F32);
  Tensor dy32 = test::randn({5, 33}, 103).to(DType::BF16).to(DType::F32);
  auto run = [&](DType dt, int which, Tensor& dx_out, Tensor& dup_out) {
    Tensor x = test::param(x32.to(dt)), up = test::param(up32.to(dt));
    Tensor y = which == 0 ? ops::silu(x) : which == 1 ? ops::gelu(x) : ops::swiglu(x, up);
    autograd::backward(y, dy32.to(dt));
    dx_out = x.grad();
    dup_out = which == 2 ? up.grad() : Tensor();
    return y;
  };
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    Tensor dx32, dup32, dx16, dup16;
    Tensor y32 = run(DType::F32, which, dx32, dup32);
    Tensor y16 = run(DType::BF16, which, dx16, dup16);
    ASSERT_EQ(y16.dtype(), DType::BF16);
    ASSERT_EQ(dx16.dtype(), DType::BF16);
    test::expect_close(y16, y32, 1e-6f, 1.0f / 256, "y");  // one rounding to bf16
    test::expect_close(dx16, dx32, 1e-6f, 1.0f / 256, "dx");
    if (which == 2) test::expect_close(dup16, dup32, 1e-6f, 1.0f / 256, "dup");
  }
}

// Mixed precision: an f32 input with y_dtype bf16 gives the f32 result rounded once (bit for bit what
// converting the f32 output would give, which is what the bf16 GEMM reading it used to do), and the
// backward is the f32 one.
TEST(Activation, Bf16OutputFromF32InputIsTheF32ResultRoundedOnce) {
  const int64_t n = 3 * 16384 + 77;  // several kernel chunks and a ragged tail
  Tensor x32 = test::randn({n}, 111, 3.0f), up32 = test::randn({n}, 112), dy = test::randn({n}, 113);
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    auto run = [&](std::optional<DType> y_dtype, Tensor& dx, Tensor& dup) {
      Tensor x = test::param(x32), up = test::param(up32);
      Tensor y = which == 0   ? ops::gelu(x, ops::GeluApproximation::None, y_dtype)
                 : which == 1 ? ops::gelu(x, ops::GeluApproximation::Tanh, y_dtype)
                              : ops::swiglu(x, up, y_dtype);
      autograd::backward(y, dy);
      dx = x.grad();
      dup = which == 2 ? up.grad() : Tensor();
      return y;
    };
    Tensor dx32, dup32, dxm, dupm;
    Tensor y32 = run(std::nullopt, dx32, dup32);
    Tensor ym = run(DType::BF16, dxm, dupm);
    ASSERT_EQ(ym.dtype(), DType::BF16);
    EXPECT_EQ(ym.to(DType::F32).to_vector<float>(), y32.to(DType::BF16).to(DType::F32).to_vector<float>());
    ASSERT_EQ(dxm.dtype(), DType::F32);
    EXPECT_EQ(dxm.to_vector<float>(), dx32.to_vector<float>());
    if (which == 2) {
      EXPECT_EQ(dupm.to_vector<float>(), dup32.to_vector<float>());
    }
  }
  expect_error_mentions([] { ops::gelu(Tensor::zeros({4}, DType::BF16), ops::GeluApproximation::None, DType::F32); },
                     {"gelu", "y_dtype f32", "bf16[4]"});
  expect_error_mentions([] { ops::swiglu(Tensor::zeros({4}), Tensor::zeros({4}), DType::I32); }, {"swiglu", "y_dtype i32"});
}

TEST(Activation, Errors) {
  expect_error_mentions([] { ops::swiglu(Tensor::zeros({2, 8}), Tensor::zeros({2, 9})); },
                     {"swiglu", "gate has shape [2, 8]", "up has shape [2, 9]"});
  expect_error_mentions([] { ops::swiglu(Tensor::zeros({2, 8}), Tensor::zeros({2, 8}, DType::BF16)); },
                     {"swiglu", "bf16"});
  expect_error_mentions([] { ops::silu(Tensor::zeros({3}, DType::I32)); }, {"silu", "x must be f32 or bf16", "i32"});
  expect_error_mentions([] { ops::gelu(Tensor()); }, {"gelu", "undefined"});
}
