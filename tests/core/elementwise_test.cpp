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
