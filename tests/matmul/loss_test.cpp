// ops::cross_entropy: PyTorch fixtures (ignored rows, large logits), gradcheck (upstream != 1), the fast
// kernel against the double-precision reference, all-ignored behaviour, bad targets.
#include "ops/loss.h"

#include <string>

#include "backends/cpu/loss.h"
#include "core/autograd.h"
#include "support/op_test.h"

using namespace loom;

namespace {
const test::Fixture& fixture() {
  static const test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/cross_entropy.json");
  return f;
}
}  // namespace

TEST(CrossEntropy, MatchesPyTorchWithIgnoredRowsAndLargeLogits) {
  const auto& f = fixture();
  Tensor logits = test::param(f.get("a_logits"));  // [2,5,33], one row offset by +1000
  Tensor loss = ops::cross_entropy(logits, f.get("a_targets"));
  EXPECT_EQ(loss.shape(), Shape{});
  test::expect_close(loss, f.get("a_loss"), 1e-5f, 1e-5f, "loss");
  loss.backward();
  test::expect_close(logits.grad(), f.get("a_dlogits"), 1e-6f, 1e-5f, "dlogits");
}

TEST(CrossEntropy, SingleRowCustomIgnoreIndex) {
  const auto& f = fixture();
  Tensor logits = test::param(f.get("b_logits"));  // [1,7]
  Tensor loss = ops::cross_entropy(logits, f.get("b_targets"), /*ignore_index=*/0);
  test::expect_close(loss, f.get("b_loss"), 1e-6f, 1e-5f, "loss");
  loss.backward();
  test::expect_close(logits.grad(), f.get("b_dlogits"), 1e-6f, 1e-5f, "dlogits");
}

TEST(CrossEntropy, GradcheckWithIgnoredRowAndUpstreamScale) {
  Tensor logits = test::param(test::randn({3, 13}, 1, 2.0f));
  Tensor targets = Tensor::from_vector<int32_t>({3}, {12, -100, 0});
  // gradcheck weighs the scalar output by a random factor: the backward's rescaling path.
  test::gradcheck([targets](const TensorList& in) { return ops::cross_entropy(in[0], targets); }, {logits},
                  1e-2f, 1e-3f, 2e-2f);
}

TEST(CrossEntropy, FastKernelMatchesDoubleReference) {
  const int64_t N = 64, V = 1003;  // V not a multiple of the vector width
  Tensor logits = test::randn({N, V}, 3, 5.0f);
  std::vector<int32_t> t(N);
  for (int64_t n = 0; n < N; ++n) t[n] = n % 7 == 3 ? -100 : static_cast<int32_t>((n * 131) % V);
  std::vector<float> g(N * V), g_ref(N * V);
  const float scale = 1.0f / 55;
  double loss = cpu::cross_entropy_forward(logits.data<float>(), t.data(), N, V, -100, g.data(), scale);
  double ref = cpu::cross_entropy_reference(logits.data<float>(), t.data(), N, V, -100, g_ref.data(), scale);
  EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
  double no_grad = cpu::cross_entropy_forward(logits.data<float>(), t.data(), N, V, -100, nullptr, scale);
  EXPECT_EQ(loss, no_grad);
  for (int64_t i = 0; i < N * V; ++i) {
    ASSERT_NEAR(g[i], g_ref[i], 1e-8f + 1e-5f * std::fabs(g_ref[i])) << "element " << i;
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGrad) {
  Tensor logits = test::param(test::randn({2, 3, 5}, 4));
  Tensor targets = Tensor::full({2, 3}, -100.0f, DType::I32);
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_EQ(loss.item(), 0.0f);
  loss.backward();
  for (float v : logits.grad().to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(CrossEntropy, NoGradPathGivesTheSameLoss) {
  Tensor logits = test::param(test::randn({4, 37}, 5));
  Tensor targets = Tensor::from_vector<int32_t>({4}, {0, 36, 5, 5});
  const float with_grad = ops::cross_entropy(logits, targets).item();
  autograd::NoGradGuard ng;
  EXPECT_EQ(ops::cross_entropy(logits, targets).item(), with_grad);
}

TEST(CrossEntropy, BadTargetsAndShapesNameTheValues) {
  Tensor logits = Tensor::zeros({2, 5});
  try {
    ops::cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {1, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("target 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("V=5"), std::string::npos) << msg;
  }
  try {
    ops::cross_entropy(logits, Tensor::from_vector<int32_t>({3}, {1, 2, 3}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos) << e.what();
  }
}
