// The op test harness (ggml-style), shared by every test area:
//   * random inputs from the counter RNG (randn);
//   * PyTorch reference fixtures: JSON files written by the committed scripts next to them
//     (tests/<area>/fixtures/make_*.py), loaded with Fixture;
//   * expect_close with absolute + relative tolerance that reports the worst element, and bitwise
//     equality;
//   * gradcheck: analytic gradients from backward() against central finite differences;
//   * error_of and EXPECT_HAS (errors.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "support/errors.h"

namespace loom::test {

inline Tensor randn(const Shape& shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), RngKey::from_seed(seed), 0, 0.0f, std);
  return t;
}

inline Tensor param(const Tensor& t) {
  Tensor p = t.clone();
  p.set_requires_grad();
  return p;
}

// Fixture files: {"name": {"shape": [...], "dtype": "f32"|"i32"|"bool", "data": [...]}, ...}
class Fixture {
 public:
  static Fixture load(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open fixture " + path);
    Fixture f;
    f.json_ = nlohmann::json::parse(in);
    f.path_ = path;
    return f;
  }
  bool has(const std::string& name) const { return json_.contains(name); }
  const nlohmann::json& raw(const std::string& name) const { return json_.at(name); }
  const nlohmann::json& raw_all() const { return json_; }
  Tensor get(const std::string& name) const {
    if (!json_.contains(name)) throw std::runtime_error("fixture " + path_ + " has no '" + name + "'");
    const auto& j = json_.at(name);
    Shape shape(j.at("shape").get<std::vector<int64_t>>());
    std::string dtype = j.value("dtype", "f32");
    const auto& data = j.at("data");
    if (dtype == "f32") return Tensor::from_vector<float>(shape, data.get<std::vector<float>>());
    if (dtype == "i32") return Tensor::from_vector<int32_t>(shape, data.get<std::vector<int32_t>>());
    if (dtype == "bool") {
      Tensor t = Tensor::empty(shape, DType::Bool);
      auto v = data.get<std::vector<int>>();
      for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i] != 0;
      return t;
    }
    throw std::runtime_error("fixture dtype " + dtype);
  }

 private:
  nlohmann::json json_;
  std::string path_;
};

inline void expect_close(const Tensor& actual, const Tensor& expected, float atol, float rtol,
                         const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": actual is undefined";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  Tensor a = actual.dtype() == DType::F32 ? actual : actual.to(DType::F32);
  Tensor e = expected.dtype() == DType::F32 ? expected : expected.to(DType::F32);
  const float* pa = a.data<float>();
  const float* pe = e.data<float>();
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double diff = std::fabs(static_cast<double>(pa[i]) - pe[i]);
    double allowed = atol + rtol * std::fabs(static_cast<double>(pe[i]));
    if (!(diff <= allowed) && (worst < 0 || diff - allowed > worst_excess)) {
      worst = i;
      worst_excess = diff - allowed;
    }
  }
  EXPECT_LT(worst, 0) << what << ": element " << worst << " is " << (worst >= 0 ? pa[worst] : 0)
                      << ", expected " << (worst >= 0 ? pe[worst] : 0) << " (atol " << atol << ", rtol "
                      << rtol << ")";
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " differs bitwise";
}

// max |actual - expected| / max |expected|: one error figure per tensor, comparable across tensors of any
// scale (the bf16 tests compare it with the error of rounding the inputs alone).
inline float max_error_relative_to_max(const Tensor& actual, const Tensor& expected) {
  float err = 0.0f, scale = 0.0f;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    err = std::max(err, std::fabs(actual.data<float>()[i] - expected.data<float>()[i]));
    scale = std::max(scale, std::fabs(expected.data<float>()[i]));
  }
  return err / scale;
}

// Checks d(sum(f(inputs) * R))/d(input) for every input that requires grad, against central differences
// on up to `max_checks` elements per input. R is a fixed random tensor, so all output positions matter.
inline void gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                      float eps = 1e-2f, float atol = 2e-3f, float rtol = 2e-2f, int max_checks = 48) {
  Tensor out = f(inputs);
  Tensor weights = randn(out.shape(), 12345);
  auto objective = [&](const Tensor& o) {
    double s = 0;
    const float* po = o.data<float>();
    const float* pw = weights.data<float>();
    for (int64_t i = 0; i < o.numel(); ++i) s += static_cast<double>(po[i]) * pw[i];
    return s;
  };
  for (const Tensor& x : inputs) {
    if (x.defined() && x.requires_grad()) const_cast<Tensor&>(x).set_grad(Tensor());
  }
  autograd::backward(out, weights);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor analytic = x.grad();
    ASSERT_TRUE(analytic.defined()) << "input " << k << " got no gradient";
    float* px = x.data<float>();
    const int64_t n = x.numel();
    const int64_t stride = std::max<int64_t>(1, n / max_checks);
    for (int64_t i = 0; i < n; i += stride) {
      float saved = px[i];
      double plus, minus;
      {
        autograd::NoGradGuard ng;
        px[i] = saved + eps;
        plus = objective(f(inputs));
        px[i] = saved - eps;
        minus = objective(f(inputs));
      }
      px[i] = saved;
      double numeric = (plus - minus) / (2.0 * eps);
      double got = analytic.data<float>()[i];
      EXPECT_NEAR(got, numeric, atol + rtol * std::fabs(numeric))
          << "input " << k << " element " << i << " of " << x.shape();
    }
  }
}

}  // namespace loom::test
