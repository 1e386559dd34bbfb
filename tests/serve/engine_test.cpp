// The serving engine (serve/engine.h) and its parts: the block pool and its prefix cache, stop strings,
// and the engine itself: greedy output equal to generate::generate's, batch invariance (a seeded request's
// tokens and logprobs the same alone or beside others, in any order, under memory pressure), blocks
// returned on finish and cancel, queueing when the KV budget is full, refusals that name the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "generate/generate.h"
#include "models/gguf.h"
#include "models/deepseek_v3/model.h"
#include "models/gpt2/model.h"
#include "models/llama/model.h"
#include "serve/block_pool.h"
#include "serve/engine.h"
#include "serve/stop_text.h"
#include "support/errors.h"
#include "support/model_fixture.h"

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::serve;

namespace {

// ---- a tiny model with a byte-level tokenizer --------------------------------------------------------

// 256 bytes and four specials: every id the model can sample decodes.
tokenizer::Tokenizer byte_tokenizer() {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> specials = {"<|endoftext|>", "<|a|>", "<|b|>", "<|c|>"};
  for (const auto& s : specials) vocab.push_back(s);
  return tokenizer::Tokenizer(vocab, {}, specials);
}

llama::Config tiny_config() {
  return {.vocab_size = 260, .context_length = 64, .d_model = 64, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
      .d_ff = 96};
}

std::vector<int32_t> prompt(uint64_t seed, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng() % 256));
  return out;
}

// What a request produced, read to its end.
struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TopLogprob>> top;
  std::string text;
  FinishReason finish = FinishReason::Error;
  std::string error;
};

Result collect(RequestHandle& h) {
  Result r;
  for (;;) {
    Update u = h.wait(std::chrono::milliseconds(200));
    r.text += u.text;
    for (const TokenOut& t : u.tokens) {
      r.tokens.push_back(t.token);
      r.logprobs.push_back(t.logprob);
      r.top.push_back(t.top);
    }
    if (u.finish) {
      r.finish = *u.finish;
      r.error = u.error;
      return r;
    }
  }
}

RequestSpec greedy(std::vector<int32_t> ids, int64_t max_tokens) {
  RequestSpec s;
  s.prompt = std::move(ids);
  s.sampling.temperature = 0;
  s.max_tokens = max_tokens;
  return s;
}

RequestSpec seeded(std::vector<int32_t> ids, int64_t max_tokens, uint64_t seed) {
  RequestSpec s;
  s.prompt = std::move(ids);
  s.sampling = {0.9f, 40, 0.95f};
  s.seed = seed;
  s.max_tokens = max_tokens;
  s.logprobs = 3;
  return s;
}

// Waits until the engine has nothing running or queued.
void settle(const Engine& e) {
  for (int i = 0; i < 500; ++i) {
    EngineStats s = e.stats();
    if (s.running == 0 && s.waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "the engine did not settle";
}

}  // namespace

// ---- the block pool ------------------------------------------------------------------------------------

TEST(BlockPool, HandsOutEveryBlockOnceAndTakesThemBack) {
  BlockPool pool(4, 16);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(*pool.allocate());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_EQ(pool.available(), 0);
  pool.release(2);
  EXPECT_EQ(pool.available(), 1);
  EXPECT_EQ(*pool.allocate(), 2);
  for (int32_t b : got) pool.release(b);
  EXPECT_EQ(pool.available(), 4);
  EXPECT_HAS(test::error_of([] { BlockPool(0, 16); }), "got 0 blocks");
}

TEST(BlockPool, APublishedPrefixIsFoundByItsTokensAndChainUntilEvicted) {
  BlockPool pool(3, 2);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  const int32_t x = *pool.allocate(), y = *pool.allocate();
  pool.publish(x, 0, a);
  const uint64_t ha = BlockPool::chain_hash(0, a);
  pool.publish(y, ha, b);
  EXPECT_EQ(pool.lookup(0, a), x);
  EXPECT_EQ(pool.lookup(ha, b), y);
  EXPECT_FALSE(pool.lookup(0, b).has_value());   // the same tokens after another prefix
  EXPECT_FALSE(pool.lookup(ha, a).has_value());
  // Released, they stay findable and count as available; retained again they leave available().
  pool.release(x);
  pool.release(y);
  EXPECT_EQ(pool.available(), 3);
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_TRUE(pool.unused(x));
  pool.retain(x);
  EXPECT_EQ(pool.available(), 2);
  pool.release(x);
  // Allocation takes the never-used block first, then the least recently released cached one (y).
  const int32_t z = *pool.allocate();
  EXPECT_NE(z, x);
  EXPECT_NE(z, y);
  EXPECT_EQ(*pool.allocate(), y);
  EXPECT_FALSE(pool.lookup(ha, b).has_value());  // y was forgotten
  EXPECT_EQ(pool.lookup(0, a), x);
}

TEST(BlockPool, ABlocksRecordedTokensLendTheirStartToTheTokenUntilEvicted) {
  BlockPool pool(3, 4);
  const int32_t x = *pool.allocate(), y = *pool.allocate();
  const std::vector<int32_t> tail = {5, 6, 7};
  pool.record(x, 0, std::span<const int32_t>(tail.data(), 2));  // x holds {5, 6} so far
  pool.record(x, 0, tail);                                        // and then {5, 6, 7}
  pool.record(y, 42, tail);                                       // the same tokens after another prefix
  const std::vector<int32_t> a = {5, 6, 9, 9}, b = {5, 6, 7, 8}, c = {1, 2};
  EXPECT_EQ(pool.longest_start(0, a), (std::pair<int32_t, int64_t>{x, 2}));
  EXPECT_EQ(pool.longest_start(0, b), (std::pair<int32_t, int64_t>{x, 3}));
  EXPECT_EQ(pool.longest_start(0, std::span<const int32_t>(b.data(), 1)), (std::pair<int32_t, int64_t>{x, 1}));
  EXPECT_EQ(pool.longest_start(0, c).second, 0);
  EXPECT_EQ(pool.longest_start(7, b).second, 0);  // no block recorded after prefix 7
  EXPECT_EQ(pool.longest_start(42, b), (std::pair<int32_t, int64_t>{y, 3}));
  // Released, a recorded block is available and still lends its tokens; allocation takes it last.
  pool.release(x);
  EXPECT_EQ(pool.available(), 2);
  EXPECT_EQ(pool.cached(), 1);
  EXPECT_TRUE(pool.unused(x));
  EXPECT_EQ(pool.longest_start(0, b).first, x);
  pool.retain(x);  // held during a copy
  EXPECT_EQ(pool.available(), 1);
  pool.release(x);
  const int32_t z = *pool.allocate();
  EXPECT_NE(z, x);
  EXPECT_EQ(*pool.allocate(), x);                 // evicted: forgotten
  EXPECT_EQ(pool.longest_start(0, b).second, 0);
  // A full block published is recorded too: a prompt that only starts like it takes that start.
  const std::vector<int32_t> full = {1, 2, 3, 4};
  pool.publish(z, 0, full);
  EXPECT_EQ(pool.longest_start(0, std::vector<int32_t>{1, 2, 9}), (std::pair<int32_t, int64_t>{z, 2}));
  EXPECT_EQ(pool.lookup(0, full), z);
}

// ---- stop strings ----------------------------------------------------------------------------------

TEST(StopText, HoldsBackWhatMayStartAStopStringAndCutsAtTheFirst) {
  StopText s({"END", "xyz"});
  EXPECT_EQ(s.push("hello E"), "hello ");  // "E" may start "END"
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("x"), "EN");             // "END" did not come; "x" may start "xyz"
  EXPECT_EQ(s.push("yz tail"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("more"), "");
  StopText t({"END"});
  EXPECT_EQ(t.push("ab EN"), "ab ");
  EXPECT_EQ(t.finish(), "EN");  // never completed: the rest of the text
  StopText u({"ab"});
  EXPECT_EQ(u.push("xaby"), "x");
}

// ---- the engine ----------------------------------------------------------------------------------------

class EngineTest : public ::testing::Test {
 protected:
  tokenizer::Tokenizer tok = byte_tokenizer();
  llama::TransformerLM model{tiny_config(), 17};
};

TEST_F(EngineTest, GreedyOutputEqualsGenerateBatchedAndPerSequence) {
  for (bool batched : {true, false}) {
    SCOPED_TRACE(batched ? "batched" : "per-sequence");
    EngineOptions o;
    o.batched = batched;
    o.kv_blocks = 40;
    o.block_size = 8;
    Engine engine(model, tok, o);
    EXPECT_EQ(engine.batched(), batched) << engine.mode();
    std::vector<std::shared_ptr<RequestHandle>> handles;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) {
      prompts.push_back(prompt(100 + i, 3 + 7 * i));
      handles.push_back(engine.submit(greedy(prompts.back(), 20)));
    }
    for (size_t i = 0; i < handles.size(); ++i) {
      Result r = collect(*handles[i]);
      generate::GenerateOptions g;
      g.max_new_tokens = 20;
      g.sampling.temperature = 0;
      EXPECT_EQ(r.tokens, generate::generate(model, prompts[i], g)) << "request " << i;
      EXPECT_EQ(r.finish, FinishReason::Length);
      std::vector<tokenizer::TokenId> ids(r.tokens.begin(), r.tokens.end());
      EXPECT_EQ(r.text, tok.decode(ids));
    }
    settle(engine);
    EXPECT_EQ(engine.stats().kv_blocks_free, 40);
  }
}

TEST_F(EngineTest, GreedyOutputOfAQuantizedGgufEqualsGenerate) {
  models::GgufImport g = models::import_gguf(LOOM_SOURCE_DIR "/tests/models/llama/fixtures/tiny_llama.gguf", true);
  ASSERT_TRUE(g.tokenizer.has_value());
  EngineOptions o;
  o.kv_blocks = 64;
  Engine engine(*g.model, *g.tokenizer, o);
  ASSERT_TRUE(engine.batched()) << engine.mode();
  const int64_t V = g.model->vocab_size();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = prompt(7 + i, 5 + 9 * i);
    for (int32_t& t : p) t %= static_cast<int32_t>(V);
    prompts.push_back(p);
    handles.push_back(engine.submit(greedy(p, 24)));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    generate::GenerateOptions go;
    go.max_new_tokens = 24;
    go.sampling.temperature = 0;
    EXPECT_EQ(collect(*handles[i]).tokens, generate::generate(*g.model, prompts[i], go)) << "request " << i;
  }
}

TEST_F(EngineTest, SeededRequestsGiveTheSameTokensAndLogprobsAloneOrTogetherInAnyOrder) {
  // The f32 model (op by op) and the same model with quantized weights (the fused step: one row alone
  // or many rows split over the threads).
  llama::TransformerLM quantized{tiny_config(), 17};
  for (nn::Linear* l : test::llama_linears(quantized)) {
    const Tensor& w = l->weight.value;
    const quant::QuantType type = l == &quantized.lm_head ? quant::QuantType::Q8_0 : quant::QuantType::Q4_1;
    l->set_quantized(std::make_shared<quant::QuantizedMatrix>(
        quant::QuantizedMatrix::quantize(type, w.data<float>(), w.size(0), w.size(1))));
  }
  ASSERT_TRUE(quantized.decoder_weights()->fused != nullptr);
  for (const llama::TransformerLM* m : {&model, &quantized}) {
    SCOPED_TRACE(m == &model ? "f32" : "quantized");
    const llama::TransformerLM& model = *m;
    // 12 requests of assorted lengths, 4 of them sharing a 16-token prefix (the prefix cache serves them
    // by whole blocks) and 4 a 6-token one (a block and 2 positions of the next, copied to the token).
    std::vector<RequestSpec> specs;
    const std::vector<int32_t> shared = prompt(999, 16), shared6 = prompt(998, 6);
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> p = prompt(200 + i, 2 + (i * 5) % 23);
      if (i % 3 == 0) p.insert(p.begin(), shared.begin(), shared.end());
      if (i % 3 == 1) p.insert(p.begin(), shared6.begin(), shared6.end());
      specs.push_back(seeded(p, 6 + i % 5 * 4, 1000 + i));
    }
    specs[5].sampling.temperature = 0;  // greedy among the sampled
    std::vector<Result> alone;
    {
      EngineOptions o;
      o.kv_blocks = 16;
      o.block_size = 4;
      Engine engine(model, tok, o);
      for (const RequestSpec& s : specs) alone.push_back(collect(*engine.submit(s)));
    }
    for (const Result& r : alone) {
      ASSERT_EQ(r.finish, FinishReason::Length) << r.error;
      ASSERT_EQ(r.top.front().size(), 3u);
    }
    // All at once, shuffled, with a budget so small that requests queue and running ones are preempted;
    // then with a large budget and steps of 8 rows (long prompts spread over many steps).
    struct Setting {
      int64_t blocks, max_running, step_tokens;
    };
    for (Setting setting : {Setting{24, 64, 256}, Setting{400, 6, 8}}) {
      SCOPED_TRACE("blocks=" + std::to_string(setting.blocks) + " step_tokens=" + std::to_string(setting.step_tokens));
      EngineOptions o;
      o.kv_blocks = setting.blocks;
      o.block_size = 4;
      o.max_running = setting.max_running;
      o.max_step_tokens = setting.step_tokens;
      o.prefill_chunk = 8;
      Engine engine(model, tok, o);
      std::vector<size_t> order(specs.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(setting.blocks)));
      std::map<size_t, std::shared_ptr<RequestHandle>> handles;
      for (size_t i : order) handles[i] = engine.submit(specs[i]);
      for (auto& [i, h] : handles) {
        Result r = collect(*h);
        EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i;
        EXPECT_EQ(r.logprobs, alone[i].logprobs) << "request " << i;
        ASSERT_EQ(r.top.size(), alone[i].top.size());
        for (size_t t = 0; t < r.top.size(); ++t) {
          for (size_t k = 0; k < r.top[t].size(); ++k) {
            EXPECT_EQ(r.top[t][k].token, alone[i].top[t][k].token);
            EXPECT_EQ(r.top[t][k].logprob, alone[i].top[t][k].logprob);
          }
        }
      }
      settle(engine);
      const EngineStats s = engine.stats();
      EXPECT_EQ(s.kv_blocks_free, setting.blocks);
      EXPECT_GT(s.prefix_hits, 0);
      EXPECT_GT(s.prefix_partial_hits, 0);
      if (setting.blocks == 24) {
        EXPECT_GT(s.preemptions, 0) << "the small budget should have preempted";
      }
    }
  }
}

TEST_F(EngineTest, APromptTakesAnEarlierPromptsPositionsToTheTokenAndGivesTheSameOutput) {
  // Blocks of 4: a prompt of 10 tokens has 2 full blocks to find by hash, then 1 position (the 10th is
  // computed: its logits are the first token's) that only the record of the earlier block can give.
  const std::vector<int32_t> p = prompt(77, 10);
  std::vector<int32_t> q(p.begin(), p.begin() + 6);  // starts like p for 6 tokens, then its own
  for (int32_t t : prompt(78, 5)) q.push_back(t);
  std::vector<int32_t> longer = p;  // p and more: p's whole reply region is new
  for (int32_t t : prompt(79, 3)) longer.push_back(t);
  for (bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "prefix cache" : "no prefix cache");
    EngineOptions o;
    o.kv_blocks = 40;
    o.block_size = 4;
    o.prefix_cache = cache;
    Engine engine(model, tok, o);
    std::vector<Result> first, again;
    const std::vector<std::vector<int32_t>> prompts = {p, q, longer};
    for (const auto& ids : prompts) first.push_back(collect(*engine.submit(seeded(ids, 8, 5))));
    const EngineStats before = engine.stats();
    for (const auto& ids : prompts) again.push_back(collect(*engine.submit(seeded(ids, 8, 5))));
    const EngineStats after = engine.stats();
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(again[i].tokens, first[i].tokens) << "prompt " << i;
      EXPECT_EQ(again[i].logprobs, first[i].logprobs) << "prompt " << i;
    }
    if (cache) {
      // First round: p nothing; q p's first block by hash, then p's second block lends 2 (q's tokens 4
      // and 5); longer p's first two blocks, then p's third (full: p's last 2 tokens, then 2 of its reply)
      // lends 2. Second round: p its own 2 blocks + 1 from the third; q its own 2 blocks (by hash now:
      // they filled up) + 2 from its third; longer its own 3 blocks, and its 13th token is computed.
      EXPECT_EQ(before.prefix_cached_tokens, 0 + (4 + 2) + (8 + 2));
      EXPECT_EQ(before.prefix_partial_hits, 2);
      EXPECT_EQ(after.prefix_cached_tokens - before.prefix_cached_tokens, (8 + 1) + (8 + 2) + 12);
      EXPECT_EQ(after.prefix_partial_hits - before.prefix_partial_hits, 2);
    } else {
      EXPECT_EQ(after.prefix_cached_tokens, 0);
      EXPECT_EQ(after.prefix_partial_hits, 0);
    }
    settle(engine);
    EXPECT_EQ(engine.stats().kv_blocks_free, 40);
  }
}

TEST_F(EngineTest, SamplesOfOneRequestDifferAndEachIsReproducible) {
  Engine engine(model, tok, EngineOptions{.kv_blocks = 40});
  RequestSpec a = seeded(prompt(5, 6), 12, 42), b = a;
  b.sample_index = 1;
  Result ra = collect(*engine.submit(a)), rb = collect(*engine.submit(b)), ra2 = collect(*engine.submit(a));
  EXPECT_NE(ra.tokens, rb.tokens);
  EXPECT_EQ(ra.tokens, ra2.tokens);
}

TEST_F(EngineTest, CancelAndTimeoutEndARequestAndFreeItsBlocks) {
  // A context of 1024, so that the cancelled request (1000 tokens to go) cannot finish before it is
  // cancelled however the threads are scheduled.
  llama::Config c = tiny_config();
  c.context_length = 1024;
  llama::TransformerLM long_model(c, 17);
  EngineOptions o;
  o.kv_blocks = 260;
  o.block_size = 4;
  Engine engine(long_model, tok, o);
  auto h = engine.submit(greedy(prompt(1, 10), 1000));
  h->wait(std::chrono::milliseconds(2000));  // its first token
  h->cancel();
  EXPECT_EQ(collect(*h).finish, FinishReason::Cancelled);
  RequestSpec late = greedy(prompt(2, 10), 1000);
  late.deadline = Clock::now();
  Result r = collect(*engine.submit(late));
  EXPECT_EQ(r.finish, FinishReason::Timeout);
  settle(engine);
  EXPECT_EQ(engine.stats().kv_blocks_free, 260);
  EXPECT_EQ(engine.stats().finished_by_reason[static_cast<int>(FinishReason::Cancelled)], 1);
}

TEST_F(EngineTest, StopsAtAStopTokenOrStringWithoutShowingIt) {
  Engine engine(model, tok, EngineOptions{.kv_blocks = 40});
  const std::vector<int32_t> p = prompt(3, 8);
  Result free_run = collect(*engine.submit(greedy(p, 12)));
  ASSERT_EQ(free_run.tokens.size(), 12u);
  // The fourth token as a stop token: three tokens come back.
  RequestSpec s = greedy(p, 12);
  s.stop_tokens = {free_run.tokens[3]};
  const size_t first = static_cast<size_t>(std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]) -
                                           free_run.tokens.begin());
  Result r = collect(*engine.submit(s));
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + static_cast<int64_t>(first)));
  // An ASCII character the reply produces after its first token, as a stop string: the text ends before
  // its first occurrence.
  std::vector<tokenizer::TokenId> all(free_run.tokens.begin(), free_run.tokens.end());
  const std::string text = tok.decode(all);
  auto ascii = std::find_if(free_run.tokens.begin() + 1, free_run.tokens.end(), [](int32_t t) { return t >= 'a' && t <= 'z'; });
  if (ascii == free_run.tokens.end()) GTEST_SKIP() << "the reply has no lowercase letter to stop at";
  RequestSpec t = greedy(p, 12);
  t.stop = {std::string(1, static_cast<char>(*ascii))};
  r = collect(*engine.submit(t));
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.text, text.substr(0, text.find(t.stop[0])));
}

TEST_F(EngineTest, QueuesWhenTheCacheIsFullAndRefusesPastTheQueueBound) {
  EngineOptions o;
  o.kv_blocks = 16;  // one 64-token context in blocks of 4
  o.block_size = 4;
  o.max_queued = 3;
  Engine engine(model, tok, o);
  // Each request needs 40 + 20 positions: 15 blocks, so they run one at a time and the rest queue.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    try {
      hs.push_back(engine.submit(greedy(prompt(i, 40), 20)));
    } catch (const EngineBusy& e) {
      ++refused;
      EXPECT_HAS(std::string(e.what()), "queue is full");
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GE(hs.size(), 3u);
  for (auto& h : hs) EXPECT_EQ(collect(*h).finish, FinishReason::Length);
  settle(engine);
  EXPECT_EQ(engine.stats().kv_blocks_free, 16);
}

TEST_F(EngineTest, RefusesBadRequestsNamingTheField) {
  Engine engine(model, tok, EngineOptions{.kv_blocks = 40});
  auto param_of = [&](RequestSpec s) -> std::string {
    try {
      engine.submit(std::move(s));
    } catch (const InvalidRequest& e) {
      return e.param();
    }
    return "(accepted)";
  };
  EXPECT_EQ(param_of(greedy({}, 4)), "prompt");
  EXPECT_EQ(param_of(greedy({1, 999}, 4)), "prompt");
  EXPECT_EQ(param_of(greedy({1}, 0)), "max_tokens");
  EXPECT_EQ(param_of(greedy(prompt(1, 60), 5)), "max_tokens");  // 65 > the context of 64
  RequestSpec s = greedy({1}, 4);
  s.sampling.temperature = -1;
  EXPECT_EQ(param_of(s), "temperature");
  s = greedy({1}, 4);
  s.sampling.top_p = 0;
  EXPECT_EQ(param_of(s), "top_p");
  s = greedy({1}, 4);
  s.logprobs = 21;
  EXPECT_EQ(param_of(s), "logprobs");
  s = greedy({1}, 4);
  s.stop = {""};
  EXPECT_EQ(param_of(s), "stop");
  // A budget below one context is refused at start-up, with the sizes.
  EXPECT_HAS(test::error_of([&] { Engine(model, tok, EngineOptions{.kv_blocks = 3}); }), "fewer than the 4");
}

TEST_F(EngineTest, DrainFinishesWhatRunsAndRefusesNewRequests) {
  Engine engine(model, tok, EngineOptions{.kv_blocks = 40});
  auto h = engine.submit(greedy(prompt(9, 5), 30));
  std::thread drainer([&] { engine.drain(); });
  Result r = collect(*h);
  drainer.join();
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.tokens.size(), 30u);
  EXPECT_THROW(engine.submit(greedy({1}, 2)), EngineClosed);
}

// GPT-2 and DeepSeek-V3, batched (their decoder_weights: one pass over every sequence's rows, DeepSeek-V3's
// latents in the pool's blocks) and per sequence (each sequence through the model's own decode path, its
// prompt cut at fixed positions): greedy output equals generate()'s, and a seeded request's tokens and
// logprobs are the same alone or beside others, in any order, with prompts sharing a prefix.
TEST(EngineFamilies, Gpt2AndDeepSeekV3GiveGenerateOutputAndBatchInvariance) {
  tokenizer::Tokenizer tok = byte_tokenizer();
  std::vector<std::unique_ptr<models::LanguageModel>> models_;
  models_.push_back(std::make_unique<gpt2::GPT2>(
      gpt2::Config{.vocab_size = 260, .context_length = 64, .d_model = 32, .num_layers = 2, .num_heads = 4}, 3));
  deepseek_v3::Config d;
  d.vocab_size = 260;
  d.context_length = 64;
  d.d_model = 32;
  d.num_layers = 2;
  d.num_heads = 2;
  d.q_rank = 16;
  d.kv_rank = 16;
  d.d_nope = 8;
  d.d_rope = 8;
  d.d_v = 8;
  d.d_ff = 48;
  d.n_routed = 4;
  d.top_k = 2;
  d.d_expert = 16;
  models_.push_back(std::make_unique<deepseek_v3::DeepSeekV3>(d, 4));
  const std::vector<int32_t> shared = prompt(999, 16);
  for (const auto& m : models_) {
    for (bool batched : {true, false}) {
      SCOPED_TRACE(m->arch() + (batched ? " batched" : " per-sequence"));
      EngineOptions o;
      o.batched = batched;
      o.prefill_chunk = 8;
      o.block_size = 8;
      o.kv_blocks = 40;
      std::vector<RequestSpec> specs;
      for (int i = 0; i < 6; ++i) {
        std::vector<int32_t> p = prompt(300 + i, 3 + 6 * i);
        if (i % 2 == 0) p.insert(p.begin(), shared.begin(), shared.end());
        specs.push_back(seeded(p, 10, 50 + i));
      }
      std::vector<Result> alone;
      {
        Engine engine(*m, tok, o);
        EXPECT_EQ(engine.batched(), batched) << engine.mode();
        EXPECT_HAS(engine.mode(), batched ? "batched" : "per-sequence");
        for (const RequestSpec& s : specs) alone.push_back(collect(*engine.submit(s)));
        generate::GenerateOptions g;
        g.max_new_tokens = 12;
        g.sampling.temperature = 0;
        for (int i = 0; i < 3; ++i) {
          const std::vector<int32_t> p = prompt(7 + i, 5 + 11 * i);
          EXPECT_EQ(collect(*engine.submit(greedy(p, 12))).tokens, generate::generate(*m, p, g)) << "prompt " << i;
        }
        // A prompt again (21 tokens: 2 blocks by hash, 4 positions copied from its third to the token;
        // keys and values, or DeepSeek-V3's latents).
        const Result repeat = collect(*engine.submit(specs[3]));
        EXPECT_EQ(repeat.tokens, alone[3].tokens);
        EXPECT_EQ(repeat.logprobs, alone[3].logprobs);
        if (batched) {
          EXPECT_GT(engine.stats().prefix_hits, 0);
          EXPECT_GT(engine.stats().prefix_partial_hits, 0);
        }
      }
      Engine engine(*m, tok, o);
      std::vector<std::shared_ptr<RequestHandle>> hs;
      for (int i = 5; i >= 0; --i) hs.push_back(engine.submit(specs[static_cast<size_t>(i)]));
      for (int i = 5; i >= 0; --i) {
        Result r = collect(*hs[static_cast<size_t>(5 - i)]);
        EXPECT_EQ(r.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
        EXPECT_EQ(r.logprobs, alone[static_cast<size_t>(i)].logprobs) << "request " << i;
      }
      settle(engine);
      EXPECT_EQ(engine.stats().kv_blocks_free, 40);
    }
  }
}
