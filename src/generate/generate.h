// The decode loop: prefill the prompt once, then one token at a time through the KV cache.
#pragma once

#include <functional>
#include <vector>

#include "generate/sampler.h"
#include "models/model.h"

namespace loom::generate {

// A bound on max_new_tokens: a million tokens is hours of decoding on a CPU, so anything larger is a
// typo (or an unchecked value from a script), refused up front instead of running until killed.
inline constexpr int64_t kMaxNewTokens = 1'000'000;

struct GenerateOptions {
  int64_t max_new_tokens = 100;  // in [0, kMaxNewTokens]
  SamplingOptions sampling;
  uint64_t seed = 0;
  int32_t stop_token = -1;  // stop after emitting this id (e.g. <|endoftext|>); -1: never
};

// Returns the new tokens (not the prompt). When prompt + output would pass the context length, the
// cache is rebuilt from the most recent half-context of tokens and decoding continues.
// `on_token` (optional) sees each token as it is produced, for streaming output.
std::vector<int32_t> generate(const models::LanguageModel& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace loom::generate
