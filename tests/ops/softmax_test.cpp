#include <cmath>
#include <limits>

#include "fixture_check.h"
#include "ops/softmax.h"

using namespace loom;

TEST(Softmax, MatchesPyTorchOnEveryDim) {
  auto f = test::load_fixture("softmax");
  for (int dim : {-1, 1, 0}) {
    std::string tag = dim < 0 ? "m1" : std::to_string(dim);
    Tensor x = test::param(f.get("x"));
    Tensor y = ops::softmax(x, dim);
    test::expect_close(y, f.get("y_" + tag), 1e-6f, 1e-5f, "softmax y dim " + tag);
    autograd::backward(y, f.get("dy_" + tag));
    test::expect_close(x.grad(), f.get("dx_" + tag), 1e-6f, 1e-4f, "softmax dx dim " + tag);
  }
}

TEST(Softmax, GradcheckLastAndMiddleDim) {
  for (int dim : {-1, 1}) {
    Tensor x = test::param(test::randn({3, 4, 21}, 7));  // 21: a vector body plus a tail
    test::gradcheck([dim](const TensorList& in) { return ops::softmax(in[0], dim); }, {x});
  }
}

TEST(Softmax, LongRowsSumToOneAndResistOverflow) {
  Tensor x = test::randn({2, 1000}, 3, 40.0f);  // logits up to ~150: exp would overflow unshifted
  Tensor y = ops::softmax(x);
  for (int r = 0; r < 2; ++r) {
    double s = 0;
    for (int j = 0; j < 1000; ++j) s += y.data<float>()[r * 1000 + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
  // Against a double-precision softmax of the same row.
  const float* px = x.data<float>();
  double mx = -1e300, sum = 0;
  for (int j = 0; j < 1000; ++j) mx = std::max(mx, static_cast<double>(px[j]));
  for (int j = 0; j < 1000; ++j) sum += std::exp(px[j] - mx);
  for (int j = 0; j < 1000; j += 37) EXPECT_NEAR(y.data<float>()[j], std::exp(px[j] - mx) / sum, 1e-6);
}

TEST(Softmax, AllMinusInfRowGivesZeros) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = Tensor::from_vector<float>({2, 3}, {-inf, -inf, -inf, 0.0f, -inf, 0.0f});
  Tensor y = ops::softmax(x);
  std::vector<float> want = {0, 0, 0, 0.5f, 0, 0.5f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << i;
}

TEST(Softmax, BadDimNamesIt) {
  test::expect_error_mentions([] { ops::softmax(Tensor::zeros({2, 3}), 2); }, {"dim 2", "[2, 3]"});
}
