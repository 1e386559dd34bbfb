// Next-token sampling from logits: greedy, temperature, top-k, top-p (nucleus).
#pragma once

#include <cstdint>

#include "core/rng.h"

namespace loom::generate {

struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no top-k filter
  float top_p = 1.0f;        // 1: no nucleus filter
  void validate() const;
};

// Draws a token from logits [V]. The draw uses random_uniform(key, index): the same key and index give
// the same token. Ties in greedy go to the lowest id.
int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options, RngKey key,
                     uint64_t index);

}  // namespace loom::generate
