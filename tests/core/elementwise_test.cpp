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
