// A sharded training run against the single-process run on the same global batches (tests/parallel):
// the parameters gathered whole from the ranks, and the checks both suites make on them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "parallel/runtime.h"

namespace loom::test {

// Whole parameter tensors by name, after a run's last step.
using WholeParameters = std::map<std::string, std::vector<float>>;

// Gathers every parameter whole from the ranks (a collective: every rank calls it); rank 0 keeps them.
inline void gather_parameters(const std::vector<nn::Parameter*>& params, const dist::RankContext& ctx,
                              WholeParameters& out) {
  for (nn::Parameter* p : params) {
    Tensor whole = dist::gather_whole(p->value, *p, ctx);
    if (ctx.rank == 0) out[p->name] = whole.to_vector<float>();
  }
}

// Step s's loss within 1e-5 and its gradient norm within 1e-4 of the reference's, relative (or within
// `norm_noise`, when larger: what the reference's own rounding is measured to move the norm by).
inline void expect_step_near(size_t s, double loss, double ref_loss, double norm, double ref_norm,
                             double norm_noise = 0) {
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "loss at step " << s + 1;
  EXPECT_NEAR(norm, ref_norm, std::max(1e-4 * ref_norm, norm_noise)) << "grad norm at step " << s + 1;
}

// The same parameters, every element within 1e-5 of the reference's.
inline void expect_parameters_near(const WholeParameters& ref, const WholeParameters& got) {
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [name, values] : ref) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    float worst = 0;
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(it->second[i] - values[i]));
    EXPECT_LE(worst, 1e-5f) << name;
  }
}

// A sharded run against one process's: every step's loss and gradient norm, then every parameter. `Run`
// has `losses`, `norms` (one per step) and `params` (WholeParameters).
// `norm_noise`, if given, has one entry per step (expect_step_near).
template <class Run>
void expect_run_equivalent(const Run& ref, const Run& got, const std::vector<double>& norm_noise = {}) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    expect_step_near(s, got.losses[s], ref.losses[s], got.norms[s], ref.norms[s], s < norm_noise.size() ? norm_noise[s] : 0);
  }
  expect_parameters_near(ref.params, got.params);
}

}  // namespace loom::test
