// The Llama as nn/paged_decoder.h's batched decoder (TransformerLM::decoder_weights): its logits against
// the model's own forward pass, f32 and quantized, and batch invariance: a sequence's logits bitwise the
// same run alone or beside others, in any order, with its prompt cut into any chunks, in any blocks of
// the cache, on any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include "core/autograd.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "models/llama/model.h"
#include "nn/paged_decoder.h"
#include "quant/qmatmul.h"
#include "support/model_fixture.h"
#include "support/paged_run.h"

using namespace loom;

namespace {

llama::Config tiny_config() {
  return {.vocab_size = 97, .context_length = 40, .d_model = 64, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
      .d_ff = 96};
}

void quantize(llama::TransformerLM& m) {
  for (nn::Linear* l : test::llama_linears(m)) {
    const Tensor& w = l->weight.value;
    const quant::QuantType type = l == &m.lm_head ? quant::QuantType::Q8_0 : quant::QuantType::Q4_1;
    l->set_quantized(std::make_shared<quant::QuantizedMatrix>(
        quant::QuantizedMatrix::quantize(type, w.data<float>(), w.size(0), w.size(1))));
  }
}

std::vector<int32_t> tokens(uint64_t seed, int64_t n, int64_t V) { return test::paged_tokens(seed, n, V); }

using Seq = test::PagedSeq;
using test::in_order;
using test::paged_chunks;

void run(const nn::DecoderWeights& w, std::vector<Seq>& seqs, int64_t block_size, int64_t stride,
         const std::function<std::vector<size_t>(int64_t, size_t)>& order) {
  test::run_paged(w, seqs, block_size, stride, order);
}

std::vector<int64_t> chunks(std::vector<int64_t> prompt_cuts, int64_t decode) {
  return paged_chunks(std::move(prompt_cuts), decode);
}

}  // namespace

TEST(PagedDecoder, GivesTheModelsLogitsF32AndQuantized) {
  for (bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "quantized" : "f32");
    llama::TransformerLM model(tiny_config(), 3);
    if (quantized) quantize(model);
    std::string why;
    auto w = llama::decoder_weights_of(model, &why);
    ASSERT_TRUE(w.has_value()) << why;
    EXPECT_TRUE(model.decoder_weights().has_value());
    const std::vector<int32_t> ids = tokens(7, 23, 97);
    // Prompt of 9 in chunks of 5 and 4, then the rest one by one; block size 4 puts chunks across blocks.
    std::vector<Seq> seqs(1);
    seqs[0].ids = ids;
    seqs[0].chunks = chunks({5, 4}, 14);
    run(*w, seqs, 4, 1, in_order);
    autograd::NoGradGuard no_grad;
    Tensor full = model.logits(Tensor::from_vector<int32_t>({1, 23}, ids));  // [1, 23, V]
    std::vector<int64_t> last = {4, 8};
    for (int64_t t = 9; t < 23; ++t) last.push_back(t);
    ASSERT_EQ(seqs[0].logits.size(), last.size());
    for (size_t i = 0; i < last.size(); ++i) {
      Tensor got = Tensor::from_vector<float>({97}, seqs[0].logits[i]);
      Tensor want = Tensor::from_vector<float>({97}, std::vector<float>(full.data<float>() + last[i] * 97,
                                                                          full.data<float>() + (last[i] + 1) * 97));
      test::expect_close(got, want, 1e-4f, 1e-4f, "position " + std::to_string(last[i]));
    }
  }
}

TEST(PagedDecoder, ASequencesLogitsAreTheSameAloneOrInAnyBatch) {
  for (bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "quantized" : "f32");
    llama::TransformerLM model(tiny_config(), 5);
    if (quantized) quantize(model);
    const nn::DecoderWeights w = *model.decoder_weights();
    // Three sequences; the third shares the first's first 8 tokens.
    std::vector<std::vector<int32_t>> ids = {tokens(1, 20, 97), tokens(2, 31, 97), tokens(3, 17, 97)};
    std::copy(ids[0].begin(), ids[0].begin() + 8, ids[2].begin());
    const std::vector<int64_t> prompts = {6, 19, 12};
    // Alone: each prompt in one chunk, then decoding; one thread, block size 4, contiguous blocks.
    std::vector<std::vector<std::vector<float>>> alone;
    for (size_t s = 0; s < ids.size(); ++s) {
      std::vector<Seq> one(1);
      one[0].ids = ids[s];
      one[0].chunks = chunks({prompts[s]}, static_cast<int64_t>(ids[s].size()) - prompts[s]);
      const int saved = num_threads();
      set_num_threads(1);
      run(w, one, 4, 1, in_order);
      set_num_threads(saved);
      alone.push_back(one[0].logits);
    }
    // Together: prompts cut into other chunks, the order of the step's items rotated or reversed at every
    // step, blocks strided through the cache, 2 or 3 threads. Only the logits of whole prompts and decoded
    // tokens are compared (a chunk that ends inside the prompt has logits nobody samples).
    struct Scenario {
      std::vector<std::vector<int64_t>> cuts;
      int64_t stride;
      int threads;
      bool reverse;
    };
    const std::vector<Scenario> scenarios = {
        {{{6}, {19}, {12}}, 3, 2, false},
        {{{1, 5}, {7, 7, 5}, {8, 4}}, 2, 3, true},
        {{{3, 3}, {1, 1, 17}, {12}}, 5, 2, false},
    };
    for (size_t k = 0; k < scenarios.size(); ++k) {
      SCOPED_TRACE("scenario " + std::to_string(k));
      const Scenario& sc = scenarios[k];
      std::vector<Seq> seqs(ids.size());
      for (size_t s = 0; s < ids.size(); ++s) {
        seqs[s].ids = ids[s];
        seqs[s].chunks = chunks(sc.cuts[s], static_cast<int64_t>(ids[s].size()) - prompts[s]);
      }
      const int saved = num_threads();
      set_num_threads(sc.threads);
      run(w, seqs, 4, sc.stride, [&](int64_t step, size_t n) {
        std::vector<size_t> o = in_order(step, n);
        std::rotate(o.begin(), o.begin() + static_cast<int64_t>(static_cast<size_t>(step) % n), o.end());
        if (sc.reverse && step % 2 == 1) std::reverse(o.begin(), o.end());
        return o;
      });
      set_num_threads(saved);
      for (size_t s = 0; s < ids.size(); ++s) {
        const size_t skip = sc.cuts[s].size() - 1;  // logits of chunks inside the prompt
        ASSERT_EQ(seqs[s].logits.size() - skip, alone[s].size());
        for (size_t i = 0; i < alone[s].size(); ++i) {
          EXPECT_EQ(std::memcmp(seqs[s].logits[skip + i].data(), alone[s][i].data(), 97 * sizeof(float)), 0)
              << "sequence " << s << ", logits " << i;
        }
      }
    }
  }
}

TEST(PagedDecoder, ChecksItsItemsNamingTheProblem) {
  llama::TransformerLM model(tiny_config(), 5);
  const nn::DecoderWeights w = *model.decoder_weights();
  nn::PagedKVCache cache(2, 4, 2, 16, 16);
  std::vector<int32_t> table = {0, 1, 2};
  std::vector<int32_t> ids(5, 1);
  std::vector<nn::DecoderBatchItem> items = {{&table, 38, std::span<const int32_t>(ids), true}};
  EXPECT_HAS(test::error_of([&] { nn::paged_decoder_forward(w, cache, items); }), "context length 40");
  items[0].start = 0;
  items[0].tokens = {};
  EXPECT_HAS(test::error_of([&] { nn::paged_decoder_forward(w, cache, items); }), "no tokens");
  EXPECT_HAS(test::error_of([] { nn::PagedKVCache(2, 0, 2, 16, 16); }), "blocks=0");
}

// The fused step (one parallel region per step, ops::paged_decode_step) against the op-by-op pass it
// replaces for quantized weights: every logit bitwise equal, for one row (every thread quantizes it for
// itself) and many (the rows split over the team), on 1-3 threads, with both activation roundings; with
// 2, 8 and 5 query heads a k/v head (the fused step's attention items: up to 4 heads of one k/v head, so
// 8 is two items a k/v head and 5 one of 4 and one of 1).
TEST(PagedDecoder, TheFusedStepIsBitwiseTheOpByOpPass) {
  nn::DecoderWeights f32 = *llama::TransformerLM(tiny_config(), 9).decoder_weights();
  EXPECT_TRUE(f32.fused == nullptr);
  EXPECT_HAS(f32.fuse(), "f32");

  const quant::ActivationRounding saved_rounding = quant::default_activation_rounding();
  llama::Config group8 = tiny_config(), group5 = tiny_config();
  group8.num_heads = 8, group8.num_kv_heads = 1;
  group5.d_model = 160, group5.num_heads = 5, group5.num_kv_heads = 1;
  for (const llama::Config& config : {tiny_config(), group8, group5}) {
    llama::TransformerLM model(config, 9);
    quantize(model);
    nn::DecoderWeights fused = *model.decoder_weights();
    ASSERT_TRUE(fused.fused != nullptr) << "the quantized tiny Llama should run fused";
    nn::DecoderWeights plain = fused;
    plain.fused.reset();
    for (quant::ActivationRounding rounding : {quant::ActivationRounding::Int8x2, quant::ActivationRounding::Int8}) {
      quant::set_default_activation_rounding(rounding);
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(quant::activation_rounding_name(rounding)) + ", threads " + std::to_string(threads) +
                     ", " + std::to_string(config.num_heads) + " heads over " + std::to_string(config.num_kv_heads));
        const int saved = num_threads();
        set_num_threads(threads);
        // One sequence decoding alone (one row a step), then four with prompts in chunks (many rows).
        for (size_t count : {size_t{1}, size_t{4}}) {
          std::vector<Seq> a(count), b(count);
          for (size_t s = 0; s < count; ++s) {
            a[s].ids = tokens(20 + s, 18 + 4 * static_cast<int64_t>(s), 97);
            a[s].chunks = count == 1 ? chunks({1}, 17) : chunks({3, 4}, 11 + 4 * static_cast<int64_t>(s));
            b[s] = a[s];
          }
          run(fused, a, 4, 2, in_order);
          run(plain, b, 4, 2, in_order);
          for (size_t s = 0; s < count; ++s) {
            ASSERT_EQ(a[s].logits.size(), b[s].logits.size());
            for (size_t i = 0; i < a[s].logits.size(); ++i) {
              EXPECT_EQ(std::memcmp(a[s].logits[i].data(), b[s].logits[i].data(), 97 * sizeof(float)), 0)
                  << count << " sequences: sequence " << s << ", logits " << i;
            }
          }
        }
        set_num_threads(saved);
      }
    }
  }
  quant::set_default_activation_rounding(saved_rounding);
}

TEST(PagedDecoder, TheFusedStepChecksItsRows) {
  llama::TransformerLM model(tiny_config(), 9);
  quantize(model);
  const nn::DecoderWeights w = *model.decoder_weights();
  ASSERT_TRUE(w.fused != nullptr);
  nn::PagedKVCache cache(2, 4, 2, 16, 16);
  std::vector<int32_t> table = {0, 1, 2}, bad_table = {0, 9};
  std::vector<int32_t> ids = {1, 2, 3}, bad_ids = {1, 500};
  std::vector<nn::DecoderBatchItem> items = {{&table, 0, std::span<const int32_t>(bad_ids), true}};
  EXPECT_HAS(test::error_of([&] { nn::paged_decoder_forward(w, cache, items); }), "token id 500");
  items = {{&bad_table, 15, std::span<const int32_t>(ids), true}};
  EXPECT_HAS(test::error_of([&] { nn::paged_decoder_forward(w, cache, items); }), "block 9");
  items = {{&table, 38, std::span<const int32_t>(ids), true}};
  EXPECT_HAS(test::error_of([&] { nn::paged_decoder_forward(w, cache, items); }), "context length 40");
}
