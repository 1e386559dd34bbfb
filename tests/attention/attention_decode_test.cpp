// cpu::attention_decode_row (the single-token decode attention over a KV cache read in place) against
// its double-precision oracle, on head sizes that take the vector paths and the scalar tails.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/attention_decode.h"

using namespace loom;

TEST(AttentionDecodeRow, MatchesTheDoubleOracle) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case { int64_t n, d, dv, stride; };
  for (const Case& c : {Case{1, 64, 64, 64}, Case{3, 64, 64, 64}, Case{4, 16, 16, 32}, Case{5, 64, 64, 80},
                        Case{37, 12, 40, 48}, Case{130, 64, 64, 64}, Case{257, 128, 128, 128}, Case{9, 8, 33, 40}}) {
    std::vector<float> q(c.d), k(c.n * c.stride), v(c.n * c.stride), out(c.dv, -1.0f), want(c.dv), scores(c.n);
    // Scores of a few units: the softmax is neither uniform nor one-hot.
    for (float& x : q) x = 0.6f * normal(gen);
    for (float& x : k) x = normal(gen);
    for (float& x : v) x = normal(gen);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    cpu::attention_decode_row(out.data(), q.data(), k.data(), c.stride, v.data(), c.stride, c.n, c.d, c.dv, scale,
                              scores.data());
    cpu::attention_decode_row_reference(want.data(), q.data(), k.data(), c.stride, v.data(), c.stride, c.n, c.d,
                                        c.dv, scale);
    for (int64_t i = 0; i < c.dv; ++i) {
      EXPECT_NEAR(out[i], want[i], 2e-6f * (1.0f + std::fabs(want[i])))
          << "n=" << c.n << " d=" << c.d << " dv=" << c.dv << " i=" << i;
    }
    if (c.n == 1) {  // one key: its value row exactly
      for (int64_t i = 0; i < c.dv; ++i) EXPECT_EQ(out[i], v[i]);
    }
  }
}

TEST(AttentionDecodeRow, ANanKeyReachesTheOutput) {
  const int64_t n = 6, d = 16;
  std::vector<float> q(d, 0.1f), k(n * d, 0.2f), v(n * d, 1.0f), out(d), scores(n);
  k[3 * d + 5] = NAN;
  cpu::attention_decode_row(out.data(), q.data(), k.data(), d, v.data(), d, n, d, d, 0.25f, scores.data());
  for (float x : out) EXPECT_TRUE(std::isnan(x));
}
