// The Llama's fused single-token decode step (models/llama/fused_decode.h) against the op-by-op path
// (TransformerLM::fused_decode = false) and the prefill, its thread-count independence, its one
// parallel region per token, and the models it declines.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/parallel.h"
#include "models/llama/fused_decode.h"
#include "models/llama/model.h"
#include "ops/decode_step.h"
#include "quant/qmatmul.h"
#include "support/model_fixture.h"

using namespace loom;
using namespace loom::quant;

namespace {

// GQA with 2 query heads per k/v head, D = 16; d_ff = 96 and vocab = 104 are not multiples of 16, so
// the thread shares end inside a 16-row block and the head has a tail of rows past its 8-row groups
// only when the vocabulary asks (104 = 13 groups of 8).
llama::Config tiny_config() {
  return {.vocab_size = 104, .context_length = 48, .d_model = 64, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
      .d_ff = 96};
}

// Q4_1 layers and a Q8_0 head, as SmolLM2's GGUF has them.
void quantize(llama::TransformerLM& m) {
  for (nn::Linear* l : test::llama_linears(m)) {
    const Tensor& w = l->weight.value;
    const QuantType type = l == &m.lm_head ? QuantType::Q8_0 : QuantType::Q4_1;
    l->set_quantized(std::make_shared<QuantizedMatrix>(QuantizedMatrix::quantize(type, w.data<float>(), w.size(0), w.size(1))));
  }
}

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // one [V] row per decoded token
  int64_t regions = 0;                     // parallel regions during the decode steps
};

// Prefill `prompt` op by op, then decode `steps` one at a time (fused or not).
DecodeRun decode(llama::TransformerLM& m, bool fused, const std::vector<int32_t>& prompt, const std::vector<int32_t>& steps) {
  autograd::NoGradGuard no_grad;
  auto cache = m.make_cache(1);
  DecodeRun r;
  if (!prompt.empty()) {
    m.forward_cached(Tensor::from_vector<int32_t>({1, static_cast<int64_t>(prompt.size())}, prompt), cache);
  }
  m.fused_decode = fused;
  for (int32_t t : steps) {
    const int64_t before = parallel_regions();
    r.logits.push_back(m.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {t}), cache).to_vector<float>());
    r.regions += parallel_regions() - before;
  }
  m.fused_decode = true;
  return r;
}

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float v : a) m = std::max(m, std::fabs(v));
  return m;
}

class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

TEST(FusedDecode, FirstTokenIsBitwiseTheOpByOpStep) {
  // At position 0 the attention is over one key (softmax weight exactly 1), so every other part of the
  // step (norms, quantized matmuls on the threads' shares, RoPE, SwiGLU, residual adds, head) must
  // give the op-by-op path's bits.
  llama::TransformerLM m(tiny_config(), 7);
  quantize(m);
  ASSERT_EQ(m.fused_decode_unsupported(), "");
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    for (int32_t token : {0, 5, 103}) {
      const DecodeRun fused = decode(m, true, {}, {token}), op = decode(m, false, {}, {token});
      EXPECT_EQ(fused.logits[0], op.logits[0]) << "token " << token << ", " << threads << " threads";
    }
  }
}

TEST(FusedDecode, MatchesTheOpByOpPathAndThePrefillOverManySteps) {
  llama::TransformerLM m(tiny_config(), 11);
  quantize(m);
  // Past 32 cached tokens: there the 8-bit activation rounding turned a different attention summation
  // order into logits 1% apart (an earlier decode kernel), which this test must catch.
  std::vector<int32_t> prompt{5, 17, 90, 3};
  for (int i = 0; i < 26; ++i) prompt.push_back((i * 37 + 11) % 104);
  const std::vector<int32_t> steps{3, 64, 12, 40, 77, 101, 0, 9, 9, 33, 2, 58, 7, 81};
  ThreadCount tc(2);
  const DecodeRun fused = decode(m, true, prompt, steps), op = decode(m, false, prompt, steps);
  // The whole sequence at once (flash attention over the prompt and every step).
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), steps.begin(), steps.end());
  autograd::NoGradGuard no_grad;
  const std::vector<float> full =
      m.forward(Tensor::from_vector<int32_t>({1, static_cast<int64_t>(all.size())}, all)).to_vector<float>();
  const int64_t V = tiny_config().vocab_size;
  for (size_t i = 0; i < steps.size(); ++i) {
    const float scale = max_abs(op.logits[i]);
    // Bit for bit: the same kernels on the same rows, attention included.
    EXPECT_EQ(fused.logits[i], op.logits[i]) << "step " << i;
    const size_t pos = prompt.size() + i;
    const std::vector<float> row(full.begin() + static_cast<int64_t>(pos) * V, full.begin() + static_cast<int64_t>(pos + 1) * V);
    EXPECT_EQ(fused.logits[i], row) << "step " << i;  // decoding is the full forward's row
    EXPECT_GT(scale, 0.1f);
  }
}

TEST(FusedDecode, LogitsDoNotDependOnTheThreadCount) {
  llama::TransformerLM m(tiny_config(), 13);
  quantize(m);
  const std::vector<int32_t> prompt{1, 2, 3}, steps{4, 99, 7, 7, 60};
  std::vector<std::vector<float>> first;
  for (int threads : {1, 2, 3, 5}) {
    ThreadCount tc(threads);
    const DecodeRun r = decode(m, true, prompt, steps);
    if (first.empty()) first = r.logits;
    EXPECT_EQ(r.logits, first) << threads << " threads";
  }
}

TEST(FusedDecode, OneParallelRegionPerToken) {
  llama::TransformerLM m(tiny_config(), 3);
  quantize(m);
  ThreadCount tc(2);
  const std::vector<int32_t> steps{4, 5, 6, 7};
  const DecodeRun fused = decode(m, true, {1, 2}, steps), op = decode(m, false, {1, 2}, steps);
  EXPECT_EQ(fused.regions, static_cast<int64_t>(steps.size()));
  // Op by op: one region per matmul at least (7 a layer and the head).
  EXPECT_GE(op.regions, static_cast<int64_t>(steps.size()) * (7 * tiny_config().num_layers + 1));
}

TEST(FusedDecode, ModelsItCannotRunTakeTheOpByOpPath) {
  llama::TransformerLM m(tiny_config(), 5);
  EXPECT_EQ(m.fused_decode_unsupported(), "layers.0.attn.q_proj.weight is not held quantized");
  quantize(m);
  m.layers[1]->ffn.w2.set_quantized(nullptr);
  EXPECT_EQ(m.fused_decode_unsupported(), "layers.1.ffn.w2.weight is not held quantized");
  // Still decodes (op by op), and its logits are finite.
  ThreadCount tc(2);
  const DecodeRun r = decode(m, true, {1}, {2, 3});
  EXPECT_GE(r.regions, 2 * 7);
  for (float v : r.logits[1]) ASSERT_TRUE(std::isfinite(v));

  llama::Config c = tiny_config();
  c.d_model = 96;  // 8 heads of 12: not a multiple of 8 (the kernels' row groups)
  c.num_heads = 8;
  llama::TransformerLM odd(c, 5);
  quantize(odd);
  EXPECT_EQ(odd.fused_decode_unsupported(), "head dim 12 is not a multiple of 8");
}

TEST(FusedDecode, RefusesABadTokenAndAFullCacheByValue) {
  llama::TransformerLM m(tiny_config(), 5);
  quantize(m);
  auto cache = m.make_cache(1);
  try {
    m.fused_decode_step(104, cache);
    FAIL() << "token 104 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 104 is outside the vocabulary [0, 104)"), std::string::npos) << e.what();
  }
  autograd::NoGradGuard no_grad;
  for (int i = 0; i < tiny_config().context_length; ++i) m.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {1}), cache);
  try {
    m.fused_decode_step(1, cache);
    FAIL() << "a step past the context accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("48 cached + 1 new token exceed context_length 48"), std::string::npos) << e.what();
  }
}


TEST(FusedDecode, DecidedWhenTheLayersChangeNotPerToken) {
  llama::TransformerLM m(tiny_config(), 9);
  EXPECT_EQ(m.fused_decode_plan(), nullptr);
  EXPECT_EQ(m.fused_decode_unsupported(), "layers.0.attn.q_proj.weight is not held quantized");
  quantize(m);
  // Planned as the last Linear got its quantized weight, before any token.
  const ops::DecodeStep* plan = m.fused_decode_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(m.fused_decode_unsupported(), "");
  ThreadCount tc(2);
  autograd::NoGradGuard no_grad;
  auto cache = m.make_cache(1);
  auto step = [&](int32_t token) {
    const int64_t before = parallel_regions();
    m.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {token}), cache);
    return parallel_regions() - before;
  };
  for (int32_t t : {3, 4, 5}) EXPECT_EQ(step(t), 1) << "token " << t;
  EXPECT_EQ(m.fused_decode_plan(), plan);  // the same prepared step for every token
  // Quantization changed after the first tokens: the next token sees it, without a per-token check.
  m.layers[0]->ffn.w3.set_quantized(nullptr);
  EXPECT_EQ(m.fused_decode_plan(), nullptr);
  EXPECT_EQ(m.fused_decode_unsupported(), "layers.0.ffn.w3.weight is not held quantized");
  EXPECT_GE(step(6), 7 * tiny_config().num_layers);  // op by op
  quantize(m);
  ASSERT_NE(m.fused_decode_plan(), nullptr);
  EXPECT_EQ(step(7), 1);
}

TEST(FusedDecode, TheOpRefusesADescriptionOrCachesOfAnotherShapeByValue) {
  llama::TransformerLM m(tiny_config(), 5);
  quantize(m);
  ASSERT_NE(m.fused_decode_plan(), nullptr);
  ops::DecodeStepWeights w = m.fused_decode_plan()->weights();
  w.layers[1].ffn_norm = Tensor::zeros({8});
  try {
    ops::DecodeStep bad(w);
    FAIL() << "a [8] ffn_norm accepted for C=64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.ffn_norm is f32[8] on cpu; expected f32 [64]"), std::string::npos)
        << e.what();
  }
  auto batch2 = m.make_cache(2);  // [2, Hkv, 48, D]
  std::vector<Tensor> k, v;
  for (int64_t i = 0; i < batch2.num_layers(); ++i) {
    k.push_back(batch2.layer(i).k);
    v.push_back(batch2.layer(i).v);
  }
  try {
    ops::decode_step(*m.fused_decode_plan(), 1, 0, k, v);
    FAIL() << "a batch-2 cache accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0's cache is f32[2, 2, 48, 16] on cpu; expected a batch-1 cache f32 [1, 2, 48, 16]"),
              std::string::npos)
        << e.what();
  }
  k.pop_back();
  try {
    ops::decode_step(*m.fused_decode_plan(), 1, 0, k, v);
    FAIL() << "one k cache too few accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 k and 2 v caches for 2 layers"), std::string::npos) << e.what();
  }
}
