#include "ops/elementwise.h"
#include "support/op_test.h"

using namespace loom;

TEST(Elementwise, GradcheckMulSubScale) {
  Tensor a = test::param(test::randn({3, 5}, 1));
  Tensor b = test::param(test::randn({3, 5}, 2));
  test::gradcheck([](const TensorList& in) { return ops::scale(ops::sub(ops::mul(in[0], in[1]), in[1]), 0.5f); },
                  {a, b});
}

TEST(Elementwise, ShapeMismatchNamesShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
  try {
    ops::add(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] vs [3, 2]"), std::string::npos) << e.what();
  }
}

#include "ops/shape.h"

TEST(Shape, TransposeMatchesIndexingAndHasGradient) {
  Tensor x = test::randn({2, 3, 4, 5}, 3);
  Tensor y = ops::transpose(x, 1, 2);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3, 5}));
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k) ASSERT_EQ(py[((b * 4 + j) * 3 + i) * 5 + k], px[((b * 3 + i) * 4 + j) * 5 + k]);
  Tensor z = ops::transpose(x, 0, 3);  // moves the innermost dimension
  EXPECT_EQ(z.data<float>()[1], px[1 * 60]);
  Tensor p = test::param(test::randn({3, 4, 2}, 4));
  test::gradcheck([](const TensorList& in) { return ops::transpose(in[0], -1, 0); }, {p});
}

TEST(Shape, ConcatAlongAnyDimWithGradient) {
  Tensor a = test::param(test::randn({2, 3}, 5)), b = test::param(test::randn({2, 1}, 6));
  Tensor c = ops::concat({a, b}, 1);
  ASSERT_EQ(c.shape(), (Shape{2, 4}));
  EXPECT_EQ(c.data<float>()[3], b.data<float>()[0]);
  EXPECT_EQ(c.data<float>()[4], a.data<float>()[3]);
  test::gradcheck([](const TensorList& in) { return ops::concat(in, 1); }, {a, b});
  EXPECT_THROW(ops::concat({a, test::randn({3, 3}, 1)}, 1), Error);
}

TEST(Shape, NarrowAnyDimWithGradientUndoesConcat) {
  Tensor x = test::param(test::randn({2, 3, 5}, 7));
  Tensor mid = ops::narrow(x, -1, 1, 3);  // [2, 3, 3]
  ASSERT_EQ(mid.shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(mid.data<float>()[0], x.data<float>()[1]);
  EXPECT_EQ(mid.data<float>()[3], x.data<float>()[6]);
  Tensor rows = ops::narrow(x, 1, 2, 1);  // [2, 1, 5]
  EXPECT_EQ(rows.data<float>()[5], x.data<float>()[25]);
  Tensor back = ops::concat({ops::narrow(x, 2, 0, 2), ops::narrow(x, 2, 2, 3)}, 2);
  EXPECT_EQ(back.to_vector<float>(), x.to_vector<float>());
  test::gradcheck([](const TensorList& in) { return ops::narrow(in[0], 2, 1, 3); }, {x});
  test::gradcheck([](const TensorList& in) { return ops::narrow(in[0], 0, 1, 1); }, {x});
  Tensor ids = Tensor::from_vector<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(ops::narrow(ids, 1, 1, 2).to_vector<int32_t>(), (std::vector<int32_t>{2, 3, 5, 6}));
  EXPECT_THROW(ops::narrow(x, 2, 3, 3), Error);  // past the end
  EXPECT_THROW(ops::narrow(x, 3, 0, 1), Error);  // no such dimension
  EXPECT_THROW(ops::narrow(x, 0, -1, 1), Error);
}
