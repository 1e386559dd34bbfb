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

// Step s's loss within 1e-5 and its gradient norm within 1e-3 of the reference's, relative. The norm is
// the looser: late in a run it is taken at parameters that already differ by rounding (up to the 1e-5
// below), and its near-zero entries react most (GPT-2 under fsdp through the stages, 5 micro-batches:
// 2.2e-4 at step 20 on a Zen 5, where its loss was within 1e-7). A wrong or missing gradient term
// moves it by percents.
inline void expect_step_near(size_t s, double loss, double ref_loss, double norm, double ref_norm) {
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "loss at step " << s + 1;
  EXPECT_NEAR(norm, ref_norm, 1e-3 * ref_norm) << "grad norm at step " << s + 1;
}

// What the reference's own rounding is measured to move its parameters by, per element (an entry larger
// than the 1e-5 tolerance loosens that element's check).
struct RoundingNoise {
  WholeParameters params;
};

// The same parameters, every element within 1e-5 of the reference's (or within `noise`'s entry, where
// larger).
inline void expect_parameters_near(const WholeParameters& ref, const WholeParameters& got, const RoundingNoise& noise = {}) {
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [name, values] : ref) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    const auto n = noise.params.find(name);
    float worst = 0;  // the distance beyond the allowed one
    size_t at = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const float allowed = std::max(1e-5f, n != noise.params.end() && i < n->second.size() ? n->second[i] : 0.0f);
      const float excess = std::abs(it->second[i] - values[i]) - allowed;
      if (excess > worst) worst = excess, at = i;
    }
    EXPECT_LE(worst, 0.0f) << name << "[" << at << "] is " << std::abs(it->second[at] - values[at])
                           << " from the reference";
  }
}

// A sharded run against one process's: every step's loss and gradient norm, then every parameter. `Run`
// has `losses`, `norms` (one per step) and `params` (WholeParameters).
template <class Run>
void expect_run_equivalent(const Run& ref, const Run& got, const RoundingNoise& noise = {}) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) expect_step_near(s, got.losses[s], ref.losses[s], got.norms[s], ref.norms[s]);
  expect_parameters_near(ref.params, got.params, noise);
}

}  // namespace loom::test
