// FLOP and parameter counts against numbers worked out by hand for a small config.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "train/config.h"
#include "report/flops.h"

using namespace loom::train;

using namespace loom::report;
using loom::models::ModelConfig;
using loom::models::ModelStats;

namespace {
// V=10, T=4, d=8, L=2, H=2 (D=4), d_ff=16.
ModelConfig small() {
  return ModelConfig::from_json(
      {{"arch", "llama"}, {"vocab_size", 10}, {"context_length", 4}, {"d_model", 8}, {"num_layers", 2},
       {"num_heads", 2}, {"d_ff", 16}});
}
ModelConfig seed_gpt2(int64_t d_model, int64_t layers, int64_t heads) {  // the seed series' untied GPT-2
  return ModelConfig::from_json({{"arch", "gpt2"}, {"d_model", d_model}, {"num_layers", layers}, {"num_heads", heads},
                                 {"qkv_bias", false}, {"tie_embeddings", false}});
}
}  // namespace

TEST(Flops, ParameterCountsByHand) {
  // embedding 10*8 = 80; per layer 4*8*8 (q,k,v,o) + 3*8*16 (SwiGLU) + 2*8 (norms) = 656;
  // final norm 8; lm_head 80. Total 80 + 2*656 + 8 + 80 = 1480; non-embedding 1400.
  EXPECT_EQ(small().stats().total_params, 1480);
  EXPECT_EQ(small().stats().matmul_params, 1400);
  EXPECT_EQ(small().build(0)->num_parameters(), 1480);
}

TEST(Flops, PalmFormulaByHand) {
  // 6*1400 + 12*L*d*T = 8400 + 12*2*8*4 = 8400 + 768.
  EXPECT_DOUBLE_EQ(small().stats().palm_flops_per_token(), 9168.0);
}

TEST(Flops, ChinchillaAppendixFByHand) {
  loom::models::ChinchillaForward f = small().stats().chinchilla;
  EXPECT_DOUBLE_EQ(f.embeddings, 640);          // 2*4*10*8
  EXPECT_DOUBLE_EQ(f.attention_qkv, 1536);      // 2*3*4*8*8
  EXPECT_DOUBLE_EQ(f.attention_logits, 256);    // 2*4*4*8
  EXPECT_DOUBLE_EQ(f.attention_softmax, 96);    // 3*2*4*4
  EXPECT_DOUBLE_EQ(f.attention_reduce, 256);    // 2*4*4*8
  EXPECT_DOUBLE_EQ(f.attention_project, 512);   // 2*4*8*8
  EXPECT_DOUBLE_EQ(f.dense, 3072);              // 2*4*(3*8*16)
  EXPECT_DOUBLE_EQ(f.logits, 640);              // 2*4*8*10
  EXPECT_DOUBLE_EQ(f.total(), 12736);           // 640 + 2*(2656 + 3072) + 640
  EXPECT_DOUBLE_EQ(small().stats().chinchilla_flops_per_token(), 9552);  // 3*12736/4
}

TEST(Flops, ReportForARun) {
  TrainConfig c;
  c.model = small();
  c.logging.peak_flops = 1;
  c.training.max_steps = 10;
  c.training.batch_size = 3;
  c.training.grad_accum_steps = 2;
  c.logging.peak_flops = 9168.0 * 1000;  // so MFU at 120 tokens/s is 0.12
  FlopsReport r = flops_report(c, 120.0);
  EXPECT_DOUBLE_EQ(r.chinchilla_optimal_tokens, 29600);  // 20 * 1480
  EXPECT_EQ(r.run_tokens, 240);                          // 10 steps * 3 * 2 * 4 tokens
  EXPECT_DOUBLE_EQ(r.run_flops, 240 * 9168.0);
  EXPECT_DOUBLE_EQ(*r.run_seconds, 2.0);
  EXPECT_DOUBLE_EQ(*r.chinchilla_optimal_seconds, 29600 / 120.0);
  EXPECT_DOUBLE_EQ(*r.mfu, 0.12);
  EXPECT_DOUBLE_EQ(mfu(100, 10, 0), 0.0);
  auto j = to_json(r);
  EXPECT_EQ(j["total_params"], 1480);
  EXPECT_EQ(j["matmul_params"], 1400);
  std::string text = format_flops_report(r);
  EXPECT_NE(text.find("1,480 total"), std::string::npos) << text;
  EXPECT_NE(text.find("9.168e+03"), std::string::npos) << text;
  FlopsReport no_speed = flops_report(c);
  EXPECT_FALSE(no_speed.run_seconds.has_value());
  EXPECT_GT(estimate_cpu_peak_flops(2), 1e9);  // at least 2 cores x 2 GHz x 8 FLOPs/cycle... roughly
}

// The seed's numbers (GPT-2 small without q/k/v bias or tying, and its Chinchilla check): parameters of
// the three models and the training FLOPs of the 163M model's 3,260,190,720 tokens, by Chinchilla's
// appendix F, to the last digit.
TEST(Flops, ReproducesTheGpt2SeedNumbersExactly) {
  EXPECT_EQ(seed_gpt2(768, 12, 12).stats().total_params, 163009536);
  EXPECT_EQ(seed_gpt2(896, 15, 14).stats().total_params, 235621120);
  EXPECT_EQ(seed_gpt2(896, 14, 14).stats().total_params, 225978368);
  const ModelStats s = seed_gpt2(768, 12, 12).stats();
  EXPECT_EQ(loom::models::chinchilla_train_flops_exact(s, 3260190720), "3544967596946227200");
  EXPECT_EQ(with_commas("3544967596946227200"), "3,544,967,596,946,227,200");
  // Its doubled runs, and the two Chinchilla-check models at 20 tokens per parameter (the seed's table).
  EXPECT_EQ(loom::models::chinchilla_train_flops_exact(s, 6520381440), "7089935193892454400");
  EXPECT_EQ(loom::models::chinchilla_train_flops_exact(seed_gpt2(896, 15, 14).stats(), int64_t{20} * 235621120),
            "7419664885127577600");
  EXPECT_EQ(loom::models::chinchilla_train_flops_exact(seed_gpt2(896, 14, 14).stats(), int64_t{20} * 225978368),
            "6804429215367168000");
  EXPECT_DOUBLE_EQ(loom::models::chinchilla_optimal_tokens(s.total_params), 3260190720.0);
  // OpenAI's GPT-2 small: tied head, q/k/v biases.
  EXPECT_EQ(ModelConfig::from_json({{"arch", "gpt2"}}).stats().total_params, 124439808);
}

TEST(Flops, ReportPrintsTheExactChinchillaFlops) {
  TrainConfig c = TrainConfig::load("gpt2-small-untied");
  FlopsReport r = flops_report(c, std::nullopt, 1e12, 3260190720);
  EXPECT_EQ(r.run_flops_chinchilla, "3544967596946227200");
  std::string text = format_flops_report(r);
  EXPECT_NE(text.find("163,009,536 total"), std::string::npos) << text;
  EXPECT_NE(text.find("3,544,967,596,946,227,200"), std::string::npos) << text;
  EXPECT_NE(text.find("Chinchilla-optimal tokens (20 per parameter): 3,260,190,720"), std::string::npos) << text;
}
