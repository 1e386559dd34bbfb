#include "generate/generate.h"

#include <algorithm>

namespace loom::generate {

std::vector<int32_t> generate(const models::LanguageModel& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options, const std::function<void(int32_t)>& on_token) {
  options.sampling.validate();
  LOOM_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token)");
  LOOM_CHECK(options.max_new_tokens >= 0 && options.max_new_tokens <= kMaxNewTokens,
             "generate: max_new_tokens must be in [0, ", kMaxNewTokens, "], got ", options.max_new_tokens);
  const int64_t V = model.vocab_size(), ctx = model.context_length();
  for (int32_t id : prompt) {
    LOOM_CHECK(id >= 0 && id < V, "generate: prompt token ", id, " is outside the vocabulary [0, ", V, ")");
  }
  const RngKey key = RngKey::from_seed(options.seed).fold_in("sample");
  std::unique_ptr<nn::DecodeCache> cache_ptr = model.make_decode_cache(1);
  nn::DecodeCache& cache = *cache_ptr;
  std::vector<int32_t> history = prompt, output;

  // Feeds `tokens` (after clearing the cache when `restart`) and returns the last position's logits.
  auto feed = [&](const std::vector<int32_t>& tokens) {
    Tensor ids = Tensor::from_vector<int32_t>({1, static_cast<int64_t>(tokens.size())}, tokens);
    return model.decode_last(ids, cache).view({1, V});  // [1, 1, V]: only the last position's logits
  };
  auto refill = [&] {
    cache.clear();
    const int64_t keep = std::min<int64_t>(static_cast<int64_t>(history.size()), std::max<int64_t>(1, ctx / 2));
    return feed(std::vector<int32_t>(history.end() - keep, history.end()));
  };

  Tensor last = static_cast<int64_t>(history.size()) <= ctx ? feed(history) : refill();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    int32_t next = sample_token(last.data<float>(), V, options.sampling, key, static_cast<uint64_t>(i));
    output.push_back(next);
    history.push_back(next);
    if (on_token) on_token(next);
    if (next == options.stop_token || i + 1 == options.max_new_tokens) break;
    last = cache.length() < ctx ? feed({next}) : refill();
  }
  return output;
}

}  // namespace loom::generate
