// Helpers shared by the norm and activation tests (tests/ops) and the CPU kernels' (tests/backends/cpu).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "support/op_test.h"

namespace loom::test {

inline Fixture norm_fixture(const std::string& name) { return Fixture::load(LOOM_TEST_DIR "/fixtures/" + name); }

// expect_close with the absolute tolerance scaled by the expected tensor's largest magnitude, so that
// cases at 1e20 or 1e-20 are held to the same relative standard as cases near 1.
// `floor` raises that scale where the result is a difference of larger terms (a normalisation's dx for
// C=1 is rstd * g * (1 - xhat^2), with xhat^2 ~ 1): f32 can only be accurate relative to those terms.
inline float max_abs(const Tensor& t) {
  Tensor f = t.dtype() == DType::F32 ? t : t.to(DType::F32);
  float m = 0.0f;
  for (float v : f.to_vector<float>()) m = std::max(m, std::fabs(v));
  return m;
}
inline void expect_close_scaled(const Tensor& actual, const Tensor& expected, float rel, const std::string& what,
                                float floor = 0.0f) {
  expect_close(actual, expected, rel * std::max(max_abs(expected), floor), rel, what);
}

// Restores the thread count when a test changes it.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(num_threads()) {}
  ~ThreadCountGuard() { set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace loom::test
