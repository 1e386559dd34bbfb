// ops::linear and ops::matmul: forward and backward against PyTorch fixtures (fixtures/make_fixtures.py),
// finite-difference gradchecks, bf16 forward, and errors that name the offending values.
#include "ops/matmul.h"

#include <string>

#include "core/autograd.h"
#include "support/op_test.h"

using namespace loom;

namespace {

const test::Fixture& linear_fixture() {
  static const test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/linear.json");
  return f;
}
const test::Fixture& matmul_fixture() {
  static const test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/matmul.json");
  return f;
}

// Transposes the last two dimensions of a contiguous f32 tensor (test helper, not recorded).
Tensor transpose_last2(const Tensor& t) {
  Shape s = t.shape();
  const int64_t r = s[-2], c = s[-1], batch = t.numel() / (r * c);
  Shape o = s;
  o[-2] = c;
  o[-1] = r;
  Tensor out = Tensor::empty(o);
  const float* p = t.data<float>();
  float* q = out.data<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) q[b * r * c + j * r + i] = p[b * r * c + i * c + j];
  return out;
}

template <typename Fn>
void expect_error_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Linear, MatchesPyTorchWithBiasForwardAndBackward) {
  const auto& f = linear_fixture();
  Tensor x = test::param(f.get("a_x")), w = test::param(f.get("a_w")), b = test::param(f.get("a_b"));
  Tensor y = ops::linear(x, w, b);
  test::expect_close(y, f.get("a_y"), 1e-5f, 1e-5f, "y");
  autograd::backward(y, f.get("a_dy"));
  test::expect_close(x.grad(), f.get("a_dx"), 1e-5f, 1e-5f, "dx");
  test::expect_close(w.grad(), f.get("a_dw"), 1e-5f, 1e-5f, "dw");
  test::expect_close(b.grad(), f.get("a_db"), 1e-5f, 1e-5f, "db");
}

TEST(Linear, BatchOneSequenceOneNoBiasMatchesPyTorch) {
  const auto& f = linear_fixture();
  Tensor x = test::param(f.get("b_x")), w = test::param(f.get("b_w"));  // x: [1,1,33], w: [5,33]
  Tensor y = ops::linear(x, w);
  test::expect_close(y, f.get("b_y"), 1e-5f, 1e-5f, "y");
  autograd::backward(y, f.get("b_dy"));
  test::expect_close(x.grad(), f.get("b_dx"), 1e-5f, 1e-5f, "dx");
  test::expect_close(w.grad(), f.get("b_dw"), 1e-5f, 1e-5f, "dw");
}

TEST(Linear, InOutLayoutMatchesPyTorchOnTransposedWeight) {
  const auto& f = linear_fixture();
  Tensor x = test::param(f.get("a_x"));
  Tensor w = test::param(transpose_last2(f.get("a_w")));  // [in, out]
  Tensor b = test::param(f.get("a_b"));
  Tensor y = ops::linear(x, w, b, ops::WeightLayout::InOut);
  test::expect_close(y, f.get("a_y"), 1e-5f, 1e-5f, "y");
  autograd::backward(y, f.get("a_dy"));
  test::expect_close(x.grad(), f.get("a_dx"), 1e-5f, 1e-5f, "dx");
  test::expect_close(w.grad(), transpose_last2(f.get("a_dw")), 1e-5f, 1e-5f, "dw");
  test::expect_close(b.grad(), f.get("a_db"), 1e-5f, 1e-5f, "db");
}

TEST(Linear, Gradcheck) {
  for (auto layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut}) {
    Tensor x = test::param(test::randn({2, 3, 13}, 1));
    Tensor w = test::param(test::randn(layout == ops::WeightLayout::OutIn ? Shape{7, 13} : Shape{13, 7}, 2, 0.5f));
    Tensor b = test::param(test::randn({7}, 3));
    test::gradcheck([layout](const TensorList& in) { return ops::linear(in[0], in[1], in[2], layout); }, {x, w, b});
  }
}

TEST(Linear, OnlyRequestedGradientsAreComputed) {
  Tensor x = test::randn({4, 5}, 1);  // no grad
  Tensor w = test::param(test::randn({3, 5}, 2));
  Tensor y = ops::linear(x, w);
  autograd::backward(y, test::randn({4, 3}, 3));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Linear, Bf16ForwardMatchesF32OnRoundedInputs) {
  Tensor x = test::randn({3, 4, 33}, 1), w = test::randn({13, 33}, 2), b = test::randn({13}, 3);
  Tensor x16 = x.to(DType::BF16), w16 = w.to(DType::BF16);
  Tensor want = ops::linear(x16.to(DType::F32), w16.to(DType::F32), b);
  Tensor got = ops::linear(x16, w16, b);
  EXPECT_EQ(got.dtype(), DType::F32);
  test::expect_close(got, want, 1e-4f, 1e-4f, "bf16 linear");
}

TEST(Linear, Bf16WithGradIsAClearError) {
  Tensor x = test::randn({2, 8}, 1).to(DType::BF16);
  Tensor w = test::randn({4, 8}, 2).to(DType::BF16);
  w.set_requires_grad();
  expect_error_containing([&] { ops::linear(x, w); }, "bf16");
  autograd::NoGradGuard ng;
  EXPECT_NO_THROW(ops::linear(x, w));
}

TEST(Linear, BadShapesNameTheValues) {
  Tensor x = Tensor::zeros({2, 7}), w = Tensor::zeros({5, 6});
  expect_error_containing([&] { ops::linear(x, w); }, "in=7");
  expect_error_containing([&] { ops::linear(x, Tensor::zeros({5, 7}), Tensor::zeros({4})); }, "[4]");
  expect_error_containing([&] { ops::linear(x, Tensor::zeros({5, 7}).to(DType::BF16)); }, "bf16");
}

TEST(Matmul, MatchesPyTorchForAllTransposes) {
  const auto& f = matmul_fixture();
  for (const char* prefix : {"t", "s"}) {  // t: batched b, s: shared 2-D b with a: [3,2,...]
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const std::string k = std::string(prefix) + std::to_string(ta) + std::to_string(tb);
        Tensor a = test::param(f.get(k + "_a")), b = test::param(f.get(k + "_b"));
        Tensor c = ops::matmul(a, b, ta, tb);
        test::expect_close(c, f.get(k + "_c"), 1e-5f, 1e-5f, k + " c");
        autograd::backward(c, f.get(k + "_dc"));
        test::expect_close(a.grad(), f.get(k + "_da"), 1e-5f, 1e-5f, k + " da");
        test::expect_close(b.grad(), f.get(k + "_db"), 1e-5f, 1e-5f, k + " db");
      }
    }
  }
}

TEST(Matmul, GradcheckBatchedAndShared) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = test::param(test::randn(ta ? Shape{2, 9, 3} : Shape{2, 3, 9}, 1));
      Tensor b = test::param(test::randn(tb ? Shape{2, 5, 9} : Shape{2, 9, 5}, 2));
      test::gradcheck([ta, tb](const TensorList& in) { return ops::matmul(in[0], in[1], ta, tb); }, {a, b});
      Tensor b2 = test::param(test::randn(tb ? Shape{5, 9} : Shape{9, 5}, 3));
      test::gradcheck([ta, tb](const TensorList& in) { return ops::matmul(in[0], in[1], ta, tb); }, {a, b2});
    }
  }
}

TEST(Matmul, PlainTwoDAndSequenceOne) {
  Tensor a = test::param(test::randn({1, 1, 7}, 1)), b = test::param(test::randn({1, 7, 13}, 2));
  test::gradcheck([](const TensorList& in) { return ops::matmul(in[0], in[1]); }, {a, b});
  Tensor a2 = test::param(test::randn({1, 33}, 3)), b2 = test::param(test::randn({33, 1}, 4));
  test::gradcheck([](const TensorList& in) { return ops::matmul(in[0], in[1]); }, {a2, b2});
}

TEST(Matmul, Bf16Forward) {
  Tensor a = test::randn({2, 5, 33}, 1).to(DType::BF16), b = test::randn({2, 13, 33}, 2).to(DType::BF16);
  Tensor want = ops::matmul(a.to(DType::F32), b.to(DType::F32), false, true);
  test::expect_close(ops::matmul(a, b, false, true), want, 1e-4f, 1e-4f, "bf16 matmul");
}

TEST(Matmul, BadShapesNameTheValues) {
  expect_error_containing([] { ops::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({2, 5, 6})); }, "K=4");
  expect_error_containing([] { ops::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 6})); },
                          "leading dimensions differ");
  expect_error_containing([] { ops::matmul(Tensor::zeros({4}), Tensor::zeros({4, 2})); }, "at least 2");
}

// Products with a zero side, as numpy and PyTorch give them (issue 32: they failed with a BLAS leading-
// dimension message): [m, 0] @ [0, n] is zeros (plus the bias), [0, k] @ [k, n] and [m, k] @ [k, 0] are
// empty; gradients have their inputs' shapes, zero where the product had no term.
TEST(Linear, ZeroSidedProductsForwardAndBackward) {
  struct Case {
    int64_t m, in, out;
  };
  for (Case c : {Case{2, 0, 3}, Case{0, 4, 3}, Case{2, 4, 0}, Case{0, 0, 0}}) {
    SCOPED_TRACE("m=" + std::to_string(c.m) + " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out));
    Tensor x = test::param(Tensor::full({c.m, c.in}, 1.0f)), w = test::param(Tensor::full({c.out, c.in}, 1.0f));
    Tensor b = test::param(Tensor::full({c.out}, 2.0f));
    Tensor y = ops::linear(x, w, b);
    ASSERT_EQ(y.shape(), (Shape{c.m, c.out}));
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], c.in == 0 ? 2.0f : 2.0f + c.in);
    autograd::backward(y, Tensor::full({c.m, c.out}, 1.0f));
    ASSERT_EQ(x.grad().shape(), x.shape());
    ASSERT_EQ(w.grad().shape(), w.shape());
    ASSERT_EQ(b.grad().shape(), b.shape());
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(x.grad().data<float>()[i], float(c.out));
    for (int64_t i = 0; i < w.numel(); ++i) EXPECT_EQ(w.grad().data<float>()[i], float(c.m));
    for (int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(b.grad().data<float>()[i], float(c.m));
  }
}

TEST(Matmul, ZeroSidedProductsForwardAndBackward) {
  for (Shape sa : {Shape{2, 3, 0}, Shape{2, 0, 4}}) {
    const int64_t k = sa[2];
    Tensor a = test::param(Tensor::full(sa, 1.0f)), b = test::param(Tensor::full({2, k, 5}, 1.0f));
    Tensor c = ops::matmul(a, b);
    ASSERT_EQ(c.shape(), (Shape{2, sa[1], 5}));
    for (int64_t i = 0; i < c.numel(); ++i) EXPECT_EQ(c.data<float>()[i], 0.0f);
    autograd::backward(c, Tensor::full(c.shape(), 1.0f));
    EXPECT_EQ(a.grad().shape(), a.shape());
    EXPECT_EQ(b.grad().shape(), b.shape());
    for (int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(b.grad().data<float>()[i], float(sa[1]));
  }
  Tensor a = Tensor::zeros({0, 3, 4}), b = Tensor::zeros({0, 4, 5});  // no batches at all
  EXPECT_EQ(ops::matmul(a, b).shape(), (Shape{0, 3, 5}));
}
