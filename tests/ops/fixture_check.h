// Shared by the attention-area tests: run an op on fixture inputs, backpropagate the fixture's
// upstream gradient, and compare output and input gradients with the PyTorch values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "support/op_test.h"

namespace loom::test {

inline Fixture load_fixture(const std::string& name) {
  return Fixture::load(std::string(LOOM_TEST_DIR) + "/fixtures/" + name + ".json");
}

// inputs become fresh leaves; `grad_names[i]` is the fixture entry for input i's gradient.
inline void check_against_fixture(const Fixture& f, const std::string& prefix,
                                  const std::function<Tensor(const TensorList&)>& op,
                                  const std::vector<std::string>& input_names,
                                  const std::vector<std::string>& grad_names, float atol = 2e-5f,
                                  float rtol = 1e-4f) {
  TensorList inputs;
  for (const auto& n : input_names) inputs.push_back(param(f.get(prefix + n)));
  Tensor y = op(inputs);
  expect_close(y, f.get(prefix + "y"), atol, rtol, prefix + "y");
  autograd::backward(y, f.get(prefix + "dy"));
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close(inputs[i].grad(), f.get(prefix + grad_names[i]), atol, rtol, prefix + grad_names[i]);
}

}  // namespace loom::test
