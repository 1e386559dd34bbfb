#include <algorithm>
#include <cmath>

#include "generate/generate.h"
#include "models/llama/model.h"
#include "support/op_test.h"

using namespace loom;

namespace {
llama::Config small_config() {
  return {.vocab_size = 41, .context_length = 12, .d_model = 32, .num_layers = 2, .num_heads = 4, .d_ff = 48};
}
}  // namespace

TEST(KVCacheDecoding, MatchesTheFullForwardAtEveryPosition) {
  for (int64_t kv_heads : {0, 2, 1}) {  // multi-head, grouped-query (the cache holds 2 heads), multi-query
  SCOPED_TRACE("num_kv_heads=" + std::to_string(kv_heads));
  llama::Config config = small_config();
  config.num_kv_heads = kv_heads;
  llama::TransformerLM model(config, 11);
  std::vector<int32_t> tokens{3, 17, 40, 0, 9, 9, 25, 1, 38, 7};
  Tensor full = model.forward(Tensor::from_vector<int32_t>({1, 10}, tokens));  // [1, 10, V]
  auto cache = model.make_cache(1);
  Tensor prefill = model.forward_cached(Tensor::from_vector<int32_t>({1, 4}, {tokens.begin(), tokens.begin() + 4}), cache);
  std::vector<float> cached = prefill.to_vector<float>();
  for (size_t i = 4; i < tokens.size(); ++i) {
    auto step = model.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {tokens[i]}), cache).to_vector<float>();
    cached.insert(cached.end(), step.begin(), step.end());
  }
  test::expect_close(Tensor::from_vector<float>({1, 10, 41}, cached), full, 1e-4f, 1e-4f, "cached logits");
  EXPECT_THROW(model.forward_cached(Tensor::zeros({1, 3}, DType::I32), cache), Error);  // 10 + 3 > 12
  EXPECT_EQ(cache.layer(0).k.size(1), config.kv_heads());
  }
}

TEST(Generate, GreedyIsDeterministicAndEqualsArgmaxOfTheFullForward) {
  llama::TransformerLM model(small_config(), 5);
  generate::GenerateOptions o;
  o.max_new_tokens = 20;  // runs past the 12-token context: exercises the cache refill
  o.sampling.temperature = 0;
  std::vector<int32_t> prompt{1, 2, 3};
  auto a = generate::generate(model, prompt, o);
  auto b = generate::generate(model, prompt, o);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  // The first few tokens (within the context) equal step-by-step argmax of the uncached model.
  std::vector<int32_t> seq = prompt;
  for (int i = 0; i < 5; ++i) {
    Tensor logits = model.forward(Tensor::from_vector<int32_t>({1, static_cast<int64_t>(seq.size())}, seq));
    const float* last = logits.data<float>() + (seq.size() - 1) * 41;
    int32_t best = static_cast<int32_t>(std::max_element(last, last + 41) - last);
    EXPECT_EQ(a[static_cast<size_t>(i)], best) << "token " << i;
    seq.push_back(best);
  }
}

TEST(Generate, MaxNewTokensIsBoundedUpFront) {
  // 2^40 tokens used to be accepted, and ran until the process was killed.
  llama::TransformerLM model(small_config(), 5);
  generate::GenerateOptions o;
  for (int64_t n : {generate::kMaxNewTokens + 1, int64_t{1} << 40, int64_t{-1}}) {
    o.max_new_tokens = n;
    try {
      generate::generate(model, {1, 2, 3}, o);
      ADD_FAILURE() << "max_new_tokens=" << n << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("generate: max_new_tokens must be in [0, 1000000], got " + std::to_string(n)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Sampler, FrequenciesFollowTemperatureTopKAndTopP) {
  const float logits[4] = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto freq = [&](generate::SamplingOptions o) {
    std::vector<double> f(4, 0.0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) f[static_cast<size_t>(generate::sample_token(logits, 4, o, RngKey::from_seed(9), static_cast<uint64_t>(i)))] += 1.0 / n;
    return f;
  };
  auto plain = freq({1.0f, 0, 1.0f});
  EXPECT_NEAR(plain[0], 0.5, 0.01);
  EXPECT_NEAR(plain[1], 0.3, 0.01);
  EXPECT_NEAR(plain[3], 0.05, 0.005);
  auto k2 = freq({1.0f, 2, 1.0f});
  EXPECT_NEAR(k2[0], 0.625, 0.01);
  EXPECT_EQ(k2[2] + k2[3], 0.0);
  auto p = freq({1.0f, 0, 0.85f});  // 0.5 + 0.3 < 0.85 <= 0.95: keeps three tokens
  EXPECT_NEAR(p[0], 0.5 / 0.95, 0.01);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_GT(p[2], 0.1);
  auto cold = freq({0.5f, 0, 1.0f});  // p^2 normalised
  EXPECT_NEAR(cold[0], 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025), 0.01);
  EXPECT_EQ(generate::sample_token(logits, 4, {0.0f, 0, 1.0f}, RngKey{}, 0), 0);
  EXPECT_THROW(generate::sample_token(logits, 4, {1.0f, 0, 0.0f}, RngKey{}, 0), Error);
  EXPECT_THROW(generate::sample_token(logits, 4, {-1.0f, 0, 1.0f}, RngKey{}, 0), Error);
}

// Logits holding NaN or +Inf (weights that went bad) are an error, greedy or sampled, not the same token
// over and over; -Inf rules a token out, unless it rules out every one (issue 32).
TEST(Sampler, NonFiniteLogitsAreAnError) {
  for (const float bad : {std::nanf(""), INFINITY}) {
    const float logits[3] = {0.5f, bad, 0.1f};
    for (const generate::SamplingOptions o : {generate::SamplingOptions{0.0f, 0, 1.0f}, generate::SamplingOptions{1.0f, 0, 1.0f}}) {
      try {
        generate::sample_token(logits, 3, o, RngKey::from_seed(1), 7);
        ADD_FAILURE() << "sampled from logits holding " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("token 1 of 3"), std::string::npos) << e.what();
      }
    }
  }
  const float masked[3] = {-INFINITY, 0.2f, -INFINITY};
  EXPECT_EQ(generate::sample_token(masked, 3, {0.0f, 0, 1.0f}, RngKey::from_seed(1), 0), 1);
  const float none[2] = {-INFINITY, -INFINITY};
  EXPECT_THROW(generate::sample_token(none, 2, {0.0f, 0, 1.0f}, RngKey::from_seed(1), 0), Error);
}

// Greedy sampling scans the logits in 16 lanes: its token is std::max_element's (the first of equal
// maxima) wherever the maximum sits, in the lanes' body or the tail, ties across lanes included; a NaN
// or +Inf anywhere is found and named; rows of -Inf but one pick that one.
TEST(Sampler, GreedyIsTheFirstMaximumAtAnyPosition) {
  const int64_t V = 49157;  // not a multiple of 16: a tail of 5
  std::vector<float> logits(static_cast<size_t>(V));
  uint32_t state = 12345;
  for (float& x : logits) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / 16777216.0f * 8.0f - 4.0f;
  }
  const generate::SamplingOptions greedy{0.0f, 0, 1.0f};
  for (const int64_t at : {int64_t{0}, int64_t{15}, int64_t{16}, int64_t{777}, V - 6, V - 5, V - 1}) {
    std::vector<float> l = logits;
    l[static_cast<size_t>(at)] = 9.0f;
    EXPECT_EQ(generate::sample_token(l.data(), V, greedy, RngKey{}, 0), at) << "max at " << at;
    // A tie later (another lane, or the tail) keeps the first; a tie earlier takes the earlier.
    for (const int64_t other : {int64_t{3}, int64_t{40001}, V - 2}) {
      if (other == at) continue;
      std::vector<float> t = l;
      t[static_cast<size_t>(other)] = 9.0f;
      EXPECT_EQ(generate::sample_token(t.data(), V, greedy, RngKey{}, 0), std::min(at, other)) << at << " and " << other;
    }
    for (const float bad : {std::nanf(""), INFINITY}) {
      std::vector<float> b = l;
      b[static_cast<size_t>(at)] = bad;
      try {
        generate::sample_token(b.data(), V, greedy, RngKey{}, 0);
        ADD_FAILURE() << "sampled from logits holding " << bad << " at " << at;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token " + std::to_string(at) + " of"), std::string::npos) << e.what();
      }
    }
    std::vector<float> masked(static_cast<size_t>(V), -INFINITY);
    masked[static_cast<size_t>(at)] = -1e30f;
    EXPECT_EQ(generate::sample_token(masked.data(), V, greedy, RngKey{}, 0), at);
  }
  EXPECT_EQ(generate::sample_token(logits.data(), V, greedy, RngKey{}, 0),
            std::max_element(logits.begin(), logits.end()) - logits.begin());
}
