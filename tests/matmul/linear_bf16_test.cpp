// linear() in MatmulPrecision::BF16 (mixed precision): the same maths as f32 up to bf16 rounding of the
// GEMM operands, f32 tensors in and out, gradients for x, w and bias.
#include "backends/cpu/elementwise.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
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
