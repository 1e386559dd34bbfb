// FLOP and parameter counts against numbers worked out by hand for a small config.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "train/flops.h"

using namespace loom::train;

namespace {
// V=10, T=4, d=8, L=2, H=2 (D=4), d_ff=16.
loom::llama::Config small() {
  loom::llama::Config c;
  c.vocab_size = 10;
  c.context_length = 4;
  c.d_model = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.d_ff = 16;
  return c;
}
}  // namespace

TEST(Flops, ParameterCountsByHand) {
  // embedding 10*8 = 80; per layer 4*8*8 (q,k,v,o) + 3*8*16 (SwiGLU) + 2*8 (norms) = 656;
  // final norm 8; lm_head 80. Total 80 + 2*656 + 8 + 80 = 1480; non-embedding 1400.
  EXPECT_EQ(small().total_params(), 1480);
  EXPECT_EQ(small().non_embedding_params(), 1400);
}

TEST(Flops, PalmFormulaByHand) {
  // 6*1400 + 12*L*d*T = 8400 + 12*2*8*4 = 8400 + 768.
  EXPECT_DOUBLE_EQ(palm_train_flops_per_token(small()), 9168.0);
}

TEST(Flops, ChinchillaAppendixFByHand) {
  ChinchillaForward f = chinchilla_forward(small());
  EXPECT_DOUBLE_EQ(f.embeddings, 640);          // 2*4*10*8
  EXPECT_DOUBLE_EQ(f.attention_qkv, 1536);      // 2*3*4*8*8
  EXPECT_DOUBLE_EQ(f.attention_logits, 256);    // 2*4*4*8
  EXPECT_DOUBLE_EQ(f.attention_softmax, 96);    // 3*2*4*4
  EXPECT_DOUBLE_EQ(f.attention_reduce, 256);    // 2*4*4*8
  EXPECT_DOUBLE_EQ(f.attention_project, 512);   // 2*4*8*8
  EXPECT_DOUBLE_EQ(f.dense, 3072);              // 2*4*(3*8*16)
  EXPECT_DOUBLE_EQ(f.logits, 640);              // 2*4*8*10
  EXPECT_DOUBLE_EQ(f.total(2), 12736);          // 640 + 2*(2656 + 3072) + 640
  EXPECT_DOUBLE_EQ(chinchilla_train_flops_per_token(small()), 9552);     // 3*12736/4
  EXPECT_DOUBLE_EQ(chinchilla_train_flops_per_token(small(), 2), 8016);  // the paper's 2-matrix MLP
}

TEST(Flops, ReportForARun) {
  TrainConfig c;
  c.model = small();
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
  EXPECT_EQ(j["non_embedding_params"], 1400);
  std::string text = format_flops_report(r);
  EXPECT_NE(text.find("1480 total"), std::string::npos) << text;
  EXPECT_NE(text.find("9.168e+03"), std::string::npos) << text;
  FlopsReport no_speed = flops_report(c);
  EXPECT_FALSE(no_speed.run_seconds.has_value());
  EXPECT_GT(estimate_cpu_peak_flops(2), 1e9);  // at least 2 cores x 2 GHz x 8 FLOPs/cycle... roughly
}
