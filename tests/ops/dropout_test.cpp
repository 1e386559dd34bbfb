// dropout: the mask is a function of (key, index) only, it drops a fraction ~p, kept values are scaled by
// 1/(1-p), the gradient uses the same mask, and bad p is rejected with its value in the message.
#include <cmath>
#include <vector>

#include "backends/cpu/activation.h"
#include "support/norm_helpers.h"
#include "ops/activation.h"

using namespace loom;
using test::expect_error_mentions;

namespace {
const RngKey kKey = RngKey::from_seed(2024).fold_in("dropout");
}

TEST(Dropout, DropsFractionPAndScalesTheRest) {
  const int64_t n = 200000;
  Tensor x = Tensor::full({n}, 1.5f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(p);
    std::vector<float> y = ops::dropout(x, p, kKey).to_vector<float>();
    int64_t dropped = 0;
    for (float v : y) {
      if (v == 0.0f) {
        ++dropped;
      } else {
        ASSERT_EQ(v, 1.5f * (1.0f / (1.0f - p)));
      }
    }
    // Binomial(n, p): 6 standard deviations is a false alarm once in ~10^9 runs.
    const double frac = static_cast<double>(dropped) / n, sd = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(frac, p, 6 * sd);
  }
}

// The vectorised Philox in the kernel must give exactly random_uniform's mask: lengths that are not a
// multiple of 4 or of the parallel chunk, and both dtypes.
TEST(Dropout, MaskIsRandomUniformBelowP) {
  for (int64_t n : {1, 3, 5, 257, 16384 * 2 + 7}) {
    SCOPED_TRACE(n);
    Tensor x = test::randn({n}, 301);
    Tensor y = Tensor::empty({n}), y_ref = Tensor::empty({n});
    cpu::dropout_forward(y.data<float>(), x.data<float>(), n, 0.3f, kKey);
    cpu::dropout_forward_reference(y_ref.data<float>(), x.data<float>(), n, 0.3f, kKey);
    EXPECT_TRUE(test::bitwise_equal(y, y_ref));
    Tensor yb = ops::dropout(x.to(DType::BF16), 0.3f, kKey);
    ASSERT_EQ(yb.dtype(), DType::BF16);
    std::vector<float> vb = yb.to(DType::F32).to_vector<float>(), vr = y_ref.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(vb[static_cast<size_t>(i)] == 0.0f, vr[static_cast<size_t>(i)] == 0.0f) << i;
  }
  // p exactly on the 2^-24 grid: element dropped iff u < p, strictly.
  const int64_t n = 4096;
  Tensor x = Tensor::full({n}, 1.0f), y = Tensor::empty({n}), y_ref = Tensor::empty({n});
  for (float p : {0.25f, 1.0f / 16777216.0f, 0.99999994f}) {
    cpu::dropout_forward(y.data<float>(), x.data<float>(), n, p, kKey);
    cpu::dropout_forward_reference(y_ref.data<float>(), x.data<float>(), n, p, kKey);
    EXPECT_TRUE(test::bitwise_equal(y, y_ref)) << p;
  }
}

TEST(Dropout, SameMaskForAnyThreadCount) {
  test::ThreadCountGuard guard;
  Tensor x = test::randn({300001}, 302);
  set_num_threads(1);
  Tensor y1 = ops::dropout(x, 0.2f, kKey);
  set_num_threads(2);
  Tensor y2 = ops::dropout(x, 0.2f, kKey);
  set_num_threads(3);
  Tensor y3 = ops::dropout(x, 0.2f, kKey);
  EXPECT_TRUE(test::bitwise_equal(y1, y2));
  EXPECT_TRUE(test::bitwise_equal(y1, y3));
}

TEST(Dropout, SameKeySameMaskOtherKeyOtherMask) {
  const int64_t n = 10000;
  Tensor x = Tensor::full({n}, 1.0f);
  Tensor a = ops::dropout(x, 0.5f, kKey), b = ops::dropout(x, 0.5f, kKey), c = ops::dropout(x, 0.5f, kKey.fold_in(1));
  EXPECT_TRUE(test::bitwise_equal(a, b));
  std::vector<float> va = a.to_vector<float>(), vc = c.to_vector<float>();
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (va[static_cast<size_t>(i)] == 0.0f) != (vc[static_cast<size_t>(i)] == 0.0f);
  // Independent masks at p = 0.5 disagree on half the elements.
  EXPECT_NEAR(static_cast<double>(differ) / n, 0.5, 0.05);
}

TEST(Dropout, GradientUsesTheForwardMask) {
  const int64_t n = 5003;
  const float p = 0.4f;
  Tensor x = test::param(test::randn({n}, 303));
  Tensor y = ops::dropout(x, p, kKey);
  Tensor dy = test::randn({n}, 304);
  autograd::backward(y, dy);
  std::vector<float> vx = x.to_vector<float>(), vy = y.to_vector<float>(), vdy = dy.to_vector<float>(),
                     vdx = x.grad().to_vector<float>();
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < vx.size(); ++i) {
    const bool kept = vy[i] != 0.0f;  // x is never exactly 0 here
    ASSERT_EQ(vdx[i], kept ? vdy[i] * scale : 0.0f) << i;
    if (kept) {
      ASSERT_EQ(vy[i], vx[i] * scale) << i;
    }
  }
  Tensor x2 = test::param(test::randn({4, 9}, 305));
  test::gradcheck([](const TensorList& in) { return ops::dropout(in[0], 0.3f, kKey); }, {x2});
}

TEST(Dropout, IdentityWhenEvaluatingOrPZero) {
  Tensor x = test::param(test::randn({3, 5}, 306));
  EXPECT_TRUE(ops::dropout(x, 0.5f, kKey, /*training=*/false).is_same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0f, kKey).is_same(x));
}

TEST(Dropout, RejectsBadP) {
  Tensor x = Tensor::zeros({4});
  expect_error_mentions([&] { ops::dropout(x, 1.0f, kKey); }, {"dropout", "[0, 1)", "p=1"});
  expect_error_mentions([&] { ops::dropout(x, -0.1f, kKey); }, {"dropout", "p=-0.1"});
  expect_error_mentions([&] { ops::dropout(x, std::nanf(""), kKey); }, {"dropout", "p=nan"});
  expect_error_mentions([&] { ops::dropout(x, 1.5f, kKey, /*training=*/false); }, {"p=1.5"});  // checked even in eval
  expect_error_mentions([&] { ops::dropout(Tensor::zeros({4}, DType::I32), 0.1f, kKey); }, {"dropout", "i32"});
}
