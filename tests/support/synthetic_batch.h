// A deterministic pseudo-random training batch for equivalence tests: step s always gives the same
// [batch, seq] ids and next-token targets (a hash of s, tokens < vocab), so a sharded run and a
// single-process run read exactly the same global batch.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::test {

inline std::pair<Tensor, Tensor> synthetic_batch(int step, int64_t batch, int64_t seq, int64_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(batch * (seq + 1)));
  uint32_t h = 2166136261u ^ static_cast<uint32_t>(step);
  for (auto& v : tokens) {
    h = (h ^ 0x9e3779b9u) * 16777619u;
    v = static_cast<int32_t>((h >> 7) % vocab);
  }
  std::vector<int32_t> ids, targets;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      ids.push_back(tokens[static_cast<size_t>(b * (seq + 1) + t)]);
      targets.push_back(tokens[static_cast<size_t>(b * (seq + 1) + t + 1)]);
    }
  }
  return {Tensor::from_vector<int32_t>({batch, seq}, ids), Tensor::from_vector<int32_t>({batch, seq}, targets)};
}

}  // namespace loom::test
