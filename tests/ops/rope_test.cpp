#include "fixture_check.h"
#include "ops/rope.h"

using namespace loom;

namespace {

struct RopeCase {
  const char* name;
  float theta;
  ops::RopeStyle style;
};

}  // namespace

TEST(Rope, MatchesPyTorchBothStyles) {
  auto f = test::load_fixture("rope");
  const RopeCase cases[] = {
      {"shared_interleaved", 10000.0f, ops::RopeStyle::Interleaved},
      {"shared_half", 10000.0f, ops::RopeStyle::RotateHalf},
      {"perrow_interleaved", 500.0f, ops::RopeStyle::Interleaved},
      {"perrow_half", 10000.0f, ops::RopeStyle::RotateHalf},
      {"long_interleaved", 10000.0f, ops::RopeStyle::Interleaved},  // position 4095: angles are large
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string p = std::string(c.name) + "_";
    Tensor pos = f.get(p + "pos");
    test::check_against_fixture(
        f, p, [&](const TensorList& in) { return ops::rope(in[0], pos, c.theta, c.style); }, {"x"}, {"dx"},
        2e-5f, 1e-4f);
  }
}

TEST(Rope, GradcheckWithRepeatedPositions) {
  Tensor pos = Tensor::from_vector<int32_t>({5}, {7, 7, 0, 100, 3});
  for (auto style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
    Tensor x = test::param(test::randn({2, 5, 10}, 11));
    test::gradcheck([&](const TensorList& in) { return ops::rope(in[0], pos, 10000.0f, style); }, {x});
  }
}

TEST(Rope, PositionZeroIsIdentityAndNormIsPreserved) {
  Tensor x = test::randn({3, 12}, 5);
  Tensor y = ops::rope(x, Tensor::from_vector<int32_t>({3}, {0, 9, 1234}), 10000.0f, ops::RopeStyle::RotateHalf);
  for (int c = 0; c < 12; ++c) EXPECT_EQ(y.data<float>()[c], x.data<float>()[c]);
  for (int r = 1; r < 3; ++r) {
    double nx = 0, ny = 0;
    for (int c = 0; c < 12; ++c) {
      nx += x.data<float>()[r * 12 + c] * x.data<float>()[r * 12 + c];
      ny += y.data<float>()[r * 12 + c] * y.data<float>()[r * 12 + c];
    }
    EXPECT_NEAR(nx, ny, 1e-4 * nx);
  }
}

TEST(Rope, InvalidInputsNameTheValues) {
  Tensor pos = Tensor::from_vector<int32_t>({4}, {0, 1, 2, 3});
  test::expect_error_mentions([&] { ops::rope(Tensor::zeros({4, 7}), pos); }, {"D=7", "even"});
  test::expect_error_mentions([&] { ops::rope(Tensor::zeros({2, 5, 8}), pos); }, {"[4]", "[5]", "[2, 5]"});
  test::expect_error_mentions([&] { ops::rope(Tensor::zeros({4, 8}), Tensor::zeros({4})); }, {"positions", "f32"});
}
