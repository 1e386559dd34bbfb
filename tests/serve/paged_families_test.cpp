// GPT-2 and DeepSeek-V3 as nn/paged_decoder.h's batched decoder (their decoder_weights): the logits of a
// sequence fed in chunks through the paged cache against the model's own forward pass; batch invariance,
// bitwise: a sequence's logits the same run alone or beside others, in any order, with its prompt cut
// into any chunks, in any blocks of the cache, on any thread count; DeepSeek-V3's cache holding only the
// latents [c | k_rope]; and descriptions that do not fit refused naming the part.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/parallel.h"
#include "models/deepseek_v3/model.h"
#include "models/gpt2/model.h"
#include "nn/paged_decoder.h"
#include "support/errors.h"
#include "support/model_fixture.h"
#include "support/paged_run.h"

using namespace loom;

namespace {

constexpr int64_t kVocab = 97;

gpt2::Config gpt2_config(bool tied) {
  gpt2::Config c{.vocab_size = kVocab, .context_length = 40, .d_model = 32, .num_layers = 2, .num_heads = 4};
  c.tie_embeddings = tied;
  return c;
}

// Two layers: a dense one and a MoE one (a shared expert, 4 routed, 2 per token).
deepseek_v3::Config dsv3_config() {
  deepseek_v3::Config d;
  d.vocab_size = kVocab;
  d.context_length = 40;
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
  return d;
}

// GPT-2 with a tied head and with its own; DeepSeek-V3 with routing biases that change its choices.
std::vector<std::unique_ptr<models::LanguageModel>> family_models() {
  std::vector<std::unique_ptr<models::LanguageModel>> out;
  out.push_back(std::make_unique<gpt2::GPT2>(gpt2_config(true), 3));
  out.push_back(std::make_unique<gpt2::GPT2>(gpt2_config(false), 4));
  auto d = std::make_unique<deepseek_v3::DeepSeekV3>(dsv3_config(), 5);
  for (deepseek_v3::MoE* m : d->moe_layers()) {
    float* b = m->bias.data<float>();
    for (int64_t e = 0; e < m->bias.numel(); ++e) b[e] = 0.01f * static_cast<float>((e * 7) % 5 - 2);
  }
  out.push_back(std::move(d));
  return out;
}

std::string name_of(const models::LanguageModel& m, size_t i) { return m.arch() + " #" + std::to_string(i); }

}  // namespace

TEST(PagedFamilies, GiveTheModelsLogits) {
  auto models_ = family_models();
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    const models::LanguageModel& model = *models_[mi];
    SCOPED_TRACE(name_of(model, mi));
    std::optional<nn::DecoderWeights> w = model.decoder_weights();
    ASSERT_TRUE(w.has_value());
    EXPECT_TRUE(w->fused == nullptr);  // f32: op by op
    const std::vector<int32_t> ids = test::paged_tokens(7 + mi, 23, kVocab);
    // Prompt of 9 in chunks of 5 and 4, then the rest one by one; block size 4 puts chunks across blocks.
    std::vector<test::PagedSeq> seqs(1);
    seqs[0].ids = ids;
    seqs[0].chunks = test::paged_chunks({5, 4}, 14);
    test::run_paged(*w, seqs, 4, 1, test::in_order);
    autograd::NoGradGuard no_grad;
    Tensor full = model.logits(Tensor::from_vector<int32_t>({1, 23}, ids));  // [1, 23, V]
    std::vector<int64_t> last = {4, 8};
    for (int64_t t = 9; t < 23; ++t) last.push_back(t);
    ASSERT_EQ(seqs[0].logits.size(), last.size());
    for (size_t i = 0; i < last.size(); ++i) {
      Tensor got = Tensor::from_vector<float>({kVocab}, seqs[0].logits[i]);
      Tensor want = Tensor::from_vector<float>(
          {kVocab}, std::vector<float>(full.data<float>() + last[i] * kVocab, full.data<float>() + (last[i] + 1) * kVocab));
      test::expect_close(got, want, 1e-4f, 1e-4f, "position " + std::to_string(last[i]));
    }
  }
}

TEST(PagedFamilies, ASequencesLogitsAreBitwiseTheSameAloneOrInAnyBatch) {
  auto models_ = family_models();
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    SCOPED_TRACE(name_of(*models_[mi], mi));
    const nn::DecoderWeights w = *models_[mi]->decoder_weights();
    // Four sequences; the third shares the first's first 8 tokens.
    std::vector<std::vector<int32_t>> ids = {test::paged_tokens(1, 20, kVocab), test::paged_tokens(2, 31, kVocab),
                                             test::paged_tokens(3, 17, kVocab), test::paged_tokens(4, 26, kVocab)};
    std::copy(ids[0].begin(), ids[0].begin() + 8, ids[2].begin());
    const std::vector<int64_t> prompts = {6, 19, 12, 2};
    // Alone: each prompt in one chunk, then decoding one token a step; one thread, contiguous blocks.
    std::vector<std::vector<std::vector<float>>> alone;
    for (size_t s = 0; s < ids.size(); ++s) {
      std::vector<test::PagedSeq> one(1);
      one[0].ids = ids[s];
      one[0].chunks = test::paged_chunks({prompts[s]}, static_cast<int64_t>(ids[s].size()) - prompts[s]);
      const int saved = num_threads();
      set_num_threads(1);
      test::run_paged(w, one, 4, 1, test::in_order);
      set_num_threads(saved);
      alone.push_back(one[0].logits);
    }
    // Together: prompts cut into other chunks, the step's items rotated or reversed at every step, blocks
    // strided through the cache, 2 or 3 threads. The logits of whole prompts and decoded tokens compared.
    struct Scenario {
      std::vector<std::vector<int64_t>> cuts;
      int64_t stride;
      int threads;
      bool reverse;
    };
    const std::vector<Scenario> scenarios = {
        {{{6}, {19}, {12}, {2}}, 3, 2, false},
        {{{1, 5}, {7, 7, 5}, {8, 4}, {1, 1}}, 2, 3, true},
    };
    for (size_t k = 0; k < scenarios.size(); ++k) {
      SCOPED_TRACE("scenario " + std::to_string(k));
      const Scenario& sc = scenarios[k];
      std::vector<test::PagedSeq> seqs(ids.size());
      for (size_t s = 0; s < ids.size(); ++s) {
        seqs[s].ids = ids[s];
        seqs[s].chunks = test::paged_chunks(sc.cuts[s], static_cast<int64_t>(ids[s].size()) - prompts[s]);
      }
      const int saved = num_threads();
      set_num_threads(sc.threads);
      test::run_paged(w, seqs, 4, sc.stride, [&](int64_t step, size_t n) {
        std::vector<size_t> o = test::in_order(step, n);
        std::rotate(o.begin(), o.begin() + static_cast<int64_t>(static_cast<size_t>(step) % n), o.end());
        if (sc.reverse && step % 2 == 1) std::reverse(o.begin(), o.end());
        return o;
      });
      set_num_threads(saved);
      for (size_t s = 0; s < ids.size(); ++s) {
        const size_t skip = sc.cuts[s].size() - 1;  // logits of chunks inside the prompt
        ASSERT_EQ(seqs[s].logits.size() - skip, alone[s].size());
        for (size_t i = 0; i < alone[s].size(); ++i) {
          EXPECT_EQ(std::memcmp(seqs[s].logits[skip + i].data(), alone[s][i].data(), kVocab * sizeof(float)), 0)
              << "sequence " << s << ", logits " << i;
        }
      }
    }
  }
}

TEST(PagedFamilies, DeepSeekV3sCacheHoldsTheLatentsOnly) {
  const deepseek_v3::Config c = dsv3_config();
  deepseek_v3::DeepSeekV3 model(c, 5);
  const nn::DecoderWeights w = *model.decoder_weights();
  EXPECT_TRUE(w.latent());
  EXPECT_FALSE(w.cache_values());
  EXPECT_EQ(w.cache_head_dim(), c.kv_rank + c.d_rope);
  // A block of 16 positions: (kv_rank + d_rope) floats per position and layer, as LatentCache's.
  EXPECT_EQ(nn::PagedKVCache::block_bytes(w, 16), c.num_layers * 16 * c.latent_cache_floats_per_layer() * 4);
  nn::PagedKVCache cache(w, 3, 16);
  EXPECT_EQ(cache.k[0].shape(), Shape({3, 1, 16, c.kv_rank + c.d_rope}));
  EXPECT_EQ(cache.v[0].data<float>(), cache.k[0].data<float>());  // one tensor: keys and values
  EXPECT_HAS(nn::DecoderWeights(w).fuse(), "latent");
}

TEST(PagedFamilies, DescriptionsThatDoNotFitAreRefusedNamingThePart) {
  deepseek_v3::DeepSeekV3 d(dsv3_config(), 5);
  nn::DecoderWeights w = *d.decoder_weights();
  w.layers[1].mla->w_uk.pop_back();
  EXPECT_HAS(test::error_of([&] { w.check(); }), "layers.1.attn.w_uk has 1 heads");
  w = *d.decoder_weights();
  w.layers[1].moe->top_k = 9;
  EXPECT_HAS(test::error_of([&] { w.check(); }), "layers.1.moe top_k 9");
  w = *d.decoder_weights();
  w.num_kv_heads = 2;
  EXPECT_HAS(test::error_of([&] { w.check(); }), "num_kv_heads must be 1");
  gpt2::GPT2 g(gpt2_config(true), 3);
  w = *g.decoder_weights();
  EXPECT_EQ(w.norm, nn::DecoderNorm::Layer);
  w.layers[0].w3 = w.layers[0].w1;
  EXPECT_HAS(test::error_of([&] { w.check(); }), "layers.0.w3 is given to a GELU MLP");
  w = *g.decoder_weights();
  w.layers[1].attn_norm_bias = Tensor();
  EXPECT_HAS(test::error_of([&] { w.check(); }), "layers.1.attn_norm_bias");
  w = *g.decoder_weights();
  w.position_embeddings = Tensor();
  EXPECT_HAS(test::error_of([&] { w.check(); }), "no learned positions");
  EXPECT_HAS(nn::DecoderWeights(*g.decoder_weights()).fuse(), "LayerNorm");
}
