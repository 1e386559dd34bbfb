// Helpers of the CUDA suite (tests/backends/cuda). Tests that need a GPU start with LOOM_REQUIRE_GPU(), which
// skips them, saying why, on machines without one (CI here): they run in tools/device_check.sh on a
// lent GPU. The tests without it check what must hold on every machine (device queries, error paths).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/runtime.h"
#include "core/rng.h"
#include "core/tensor.h"

#define LOOM_REQUIRE_GPU()                                                                  \
  do {                                                                                      \
    if (!::loom::cuda_available()) GTEST_SKIP() << ::loom::cuda::unavailable_reason();      \
  } while (0)

namespace loom::test {

// The device the suite runs on.
inline const Device kGpu = Device::cuda(0);

inline Tensor random_cpu(const Shape& shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), RngKey::from_seed(seed), 0, 0.0f, std);
  return t;
}

// f32 values of any float tensor, on the host.
inline std::vector<float> host_values(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  if (h.dtype() != DType::F32) h = h.to(DType::F32);
  return h.to_vector<float>();
}

// ||a - b|| / ||b||, with NaN anywhere counted as failure (returns +inf).
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline double norm_of(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return std::sqrt(s);
}

// ||a - b|| / max(||b||, floor): for a gradient whose exact value is 0 (a key bias under softmax's shift
// invariance, dq and dk with one key), both backends return rounding noise of the size of the op's other
// gradients, and its relative error says nothing; `floor` is then such a gradient's norm.
inline double relative_error_floored(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  }
  const double den = std::max(norm_of(b), floor);
  return den == 0 ? std::sqrt(num) : std::sqrt(num) / den;
}

// Tolerances by dtype (the device README's method: f32 far under 1e-3; bf16 operands 1e-3..1e-2).
inline double tolerance(DType t) { return t == DType::BF16 ? 1e-2 : 2e-5; }

// A tensor claiming to live on cuda:0 over host memory: it reaches an op's device checks on any
// machine, which is all the error-path tests need (no kernel ever runs on it).
inline Tensor fake_cuda(const Shape& shape, DType dtype = DType::F32) {
  // Zero bytes: valid as every dtype (0.0f, id 0, false), sized for the widest (4 bytes).
  auto host = std::make_shared<std::vector<float>>(static_cast<size_t>(shape.numel()), 0.0f);
  return Tensor::wrap(host->data(), shape, dtype, Device::cuda(0), host);
}

}  // namespace loom::test
