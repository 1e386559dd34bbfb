// linear() in MatmulPrecision::BF16 (mixed precision): the same maths as f32 up to bf16 rounding of the
// GEMM operands, f32 tensors in and out, gradients for x, w and bias.
#include "backends/cpu/elementwise.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "support/op_test.h"

using namespace loom;

namespace {
// The exact result of the bf16 computation: the f32 op on operands rounded to bf16.
Tensor rounded(const Tensor& t) { return t.to(DType::BF16).to(DType::F32); }
}  // namespace

TEST(LinearBf16, EqualsF32LinearOnRoundedOperands) {
  for (auto layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut}) {
    Tensor x = test::param(test::randn({3, 5, 33}, 1));
    Tensor w = test::param(layout == ops::WeightLayout::OutIn ? test::randn({17, 33}, 2) : test::randn({33, 17}, 2));
    Tensor b = test::param(test::randn({17}, 3));
    Tensor dy = test::randn({3, 5, 17}, 4);
    Tensor y = ops::linear(x, w, b, layout, ops::MatmulPrecision::BF16);
    autograd::backward(y, dy);
    // Reference: f32 linear on rounded x, w; its gradients with a rounded dy (what the bf16 GEMMs see).
    Tensor xr = test::param(rounded(x)), wr = test::param(rounded(w)), br = test::param(b.detach());
    Tensor yr = ops::linear(xr, wr, br, layout);
    autograd::backward(yr, rounded(dy));
    test::expect_close(y, yr, 1e-5f, 1e-5f, "y");
    test::expect_close(x.grad(), xr.grad(), 1e-5f, 1e-5f, "dx");
    test::expect_close(w.grad(), wr.grad(), 1e-5f, 1e-5f, "dw");
    // The bias gradient sums the f32 dy, as in f32.
    Tensor db = Tensor::zeros({17});
    for (int64_t r = 0; r < 15; ++r)
      for (int64_t o = 0; o < 17; ++o) db.data<float>()[o] += dy.data<float>()[r * 17 + o];
    test::expect_close(b.grad(), db, 1e-5f, 1e-5f, "db");
  }
}

TEST(LinearBf16, CloseToF32) {
  Tensor x = test::randn({64, 128}, 5), w = test::randn({96, 128}, 6);
  Tensor y32 = ops::linear(x, w), y16 = ops::linear(x, w, Tensor(), ops::WeightLayout::OutIn, ops::MatmulPrecision::BF16);
  // bf16 keeps 8 bits of mantissa: relative error about 2^-8 per operand, averaged over K=128 terms.
  test::expect_close(y16, y32, 0.15f, 0.02f, "bf16 vs f32");
}

TEST(LinearBf16, ConvertRoundsToNearestEven) {
  std::vector<float> v{1.0f, 1.00390625f, 1.01171875f, -2.5f, 3.14159f, 1e-30f, 65504.0f};
  for (int i = 0; i < 40; ++i) v.push_back(static_cast<float>(i) * 0.37f - 5.0f);
  std::vector<bf16> out(v.size());
  cpu::convert_f32_to_bf16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(out[i].bits, bf16::from_float(v[i]).bits) << v[i];
}

// What a mixed-precision model hands linear(): x already rounded by the norm before it (a bf16 tensor
// that autodiff tracks), and the weight's bf16 copy kept by the optimizer. Both must give the very bits
// of the plain BF16 path (which rounds x and w itself), gradients included: the norm receives the same
// f32 gradient either way.
TEST(LinearBf16, PreRoundedXAndWeightCopyGiveTheSameBits) {
  const auto bf = ops::MatmulPrecision::BF16;
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    Tensor x0 = test::randn({4, 6, 40}, 21), w0 = test::randn({24, 40}, 22), g0 = test::randn({40}, 27);
    Tensor b0 = with_bias ? test::randn({24}, 23) : Tensor();
    Tensor dy = test::randn({4, 6, 24}, 24);
    auto run = [&](bool pre_rounded) {
      Tensor x = test::param(x0), w = test::param(w0), g = test::param(g0);
      Tensor b = with_bias ? test::param(b0) : Tensor();
      Tensor h = pre_rounded ? ops::rms_norm(x, g, 1e-5f, DType::BF16) : ops::rms_norm(x, g);
      EXPECT_EQ(h.dtype(), pre_rounded ? DType::BF16 : DType::F32);
      Tensor y = ops::linear(h, w, b, ops::WeightLayout::OutIn, bf, pre_rounded ? w0.to(DType::BF16) : Tensor());
      autograd::backward(y, dy);
      return TensorList{y, x.grad(), w.grad(), g.grad(), with_bias ? b.grad() : Tensor()};
    };
    const TensorList a = run(false), b = run(true);
    const char* names[] = {"y", "dx", "dw", "dgain", "dbias"};
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].defined()) continue;
      ASSERT_EQ(b[i].dtype(), DType::F32) << names[i];
      EXPECT_EQ(b[i].to_vector<float>(), a[i].to_vector<float>()) << names[i];
    }
  }
  Tensor x = test::randn({3, 40}, 25), w = test::randn({24, 40}, 26);
  test::expect_error_mentions([&] { ops::linear(x, w, Tensor(), ops::WeightLayout::OutIn, bf, Tensor::zeros({40, 24}, DType::BF16)); },
                     {"linear", "w_bf16 is bf16[40, 24]", "w is f32[24, 40]"});
  test::expect_error_mentions([&] { ops::linear(x, w, Tensor(), ops::WeightLayout::OutIn, ops::MatmulPrecision::F32, w.to(DType::BF16)); },
                     {"linear", "w_bf16 is for MatmulPrecision::BF16"});
  // A bf16 x with an f32 w is mixed precision only: in f32 the dtypes must match, as before.
  test::expect_error_mentions([&] { ops::linear(x.to(DType::BF16), w); }, {"linear", "x is bf16", "w is f32"});
}
