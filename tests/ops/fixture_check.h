// Shared by the attention-area tests: run an op on fixture inputs, backpropagate the fixture's
// upstream gradient, and compare output and input gradients with the PyTorch values; and the same
// comparison between two attention implementations at (q, k, v), and their memory at long T.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/parallel.h"
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

// Output and input gradients of f at (q, k, v) for upstream gradient dy.
inline TensorList run_with_grads(const std::function<Tensor(const TensorList&)>& f, const TensorList& qkv,
                                 const Tensor& dy) {
  TensorList in;
  for (const Tensor& t : qkv) in.push_back(param(t));
  Tensor y = f(in);
  autograd::backward(y, dy);
  return {y, in[0].grad(), in[1].grad(), in[2].grad()};
}

// run_with_grads on 1, 2 and 3 threads (the thread count restored afterwards), for the checks that
// results do not depend on it.
inline std::array<TensorList, 3> run_on_1_2_3_threads(const std::function<Tensor(const TensorList&)>& f,
                                                      const TensorList& qkv, const Tensor& dy) {
  const int saved = num_threads();
  std::array<TensorList, 3> runs;
  for (int n = 1; n <= 3; ++n) {
    set_num_threads(n);
    runs[static_cast<size_t>(n - 1)] = run_with_grads(f, qkv, dy);
  }
  set_num_threads(saved);
  return runs;
}

// run_with_grads' four results against another run's.
inline void expect_all_close(const TensorList& got, const TensorList& want, float atol, float rtol,
                             const std::string& what) {
  const char* names[] = {"y", "dq", "dk", "dv"};
  for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], atol, rtol, what + " " + names[i]);
}

// Runs f (attention over one head) forward and backward at T=4096, D=32, inputs drawn from seeds
// seed..seed+3, and checks that the CPU allocator's peak grew by at most 32 [T, D] buffers (16 MiB, a
// quarter of one [T, T] f32 matrix). Returns the growth.
inline int64_t expect_memory_linear_in_t(const std::function<Tensor(const TensorList&)>& f, uint64_t seed) {
  const int64_t t = 4096, d = 32;
  TensorList qkv = {randn({1, t, d}, seed), randn({1, t, d}, seed + 1), randn({1, t, d}, seed + 2)};
  Tensor dy = randn({1, t, d}, seed + 3);
  Allocator& alloc = allocator_for(Device::cpu());
  const AllocatorStats before = alloc.stats();
  run_with_grads(f, qkv, dy);
  const AllocatorStats after = alloc.stats();
  const int64_t budget = 32 * t * d * 4;
  EXPECT_LE(after.peak_bytes_in_use, std::max(before.peak_bytes_in_use, before.bytes_in_use + budget))
      << "peak grew by " << (after.peak_bytes_in_use - before.bytes_in_use) << " bytes";
  return after.peak_bytes_in_use - before.bytes_in_use;
}

}  // namespace loom::test
