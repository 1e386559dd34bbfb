// Accuracy of the vectorisable exp/sigmoid/erf (backends/cpu/simd_math.h) against double-precision libm,
// in ulps of the f32 result: the bounds simd_math.h documents.
#include <cmath>

#include "backends/cpu/simd_math.h"
#include "support/norm_helpers.h"

using namespace loom;

namespace {
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}
}  // namespace

TEST(SimdMath, ExpWithinOneUlp) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.00731f) worst = std::max(worst, ulps(cpu::simd::exp(x), std::exp(static_cast<double>(x))));
  EXPECT_LE(worst, 1.1);
  EXPECT_EQ(cpu::simd::exp(-100.0f), 0.0f);
  EXPECT_EQ(cpu::simd::exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::simd::exp(1000.0f), INFINITY);
}

TEST(SimdMath, SigmoidWithinFewUlp) {
  double worst = 0;
  for (float x = -80.0f; x < 80.0f; x += 0.00731f) {
    worst = std::max(worst, ulps(cpu::simd::sigmoid(x), 1.0 / (1.0 + std::exp(-static_cast<double>(x)))));
  }
  EXPECT_LE(worst, 2.5);
  EXPECT_EQ(cpu::simd::sigmoid(1e30f), 1.0f);
  EXPECT_EQ(cpu::simd::sigmoid(-1e30f), 0.0f);
}

TEST(SimdMath, ErfAccurate) {
  double worst_abs = 0, worst_ulp_core = 0;
  for (float x = -6.0f; x < 6.0f; x += 0.000731f) {
    const double want = std::erf(static_cast<double>(x));
    worst_abs = std::max(worst_abs, std::fabs(cpu::simd::erf(x) - want));
    if (std::fabs(x) < 2.0f && std::fabs(x) > 1e-3f) worst_ulp_core = std::max(worst_ulp_core, ulps(cpu::simd::erf(x), want));
  }
  EXPECT_LE(worst_abs, 3.5e-7);
  EXPECT_LE(worst_ulp_core, 4.0);
  EXPECT_NEAR(cpu::simd::erf(1e-4f), std::erf(static_cast<double>(1e-4f)), 2e-11);  // ~1 ulp: relative accuracy near 0
}
