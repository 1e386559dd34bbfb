// loom eval's arithmetic on hand-computed cases.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/op_test.h"
#include "train/evaluate.h"
#include "models/llama/model.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

struct TokenDir {
  fs::path dir = fs::temp_directory_path() / ("loom_eval_test_" + std::to_string(::getpid()));
  explicit TokenDir(const std::vector<uint16_t>& tokens) {
    fs::create_directories(dir);
    std::ofstream(dir / "val.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    std::ofstream(dir / "meta.json") << R"({"dtype": "uint16", "vocab_size": 16})";
  }
  ~TokenDir() { fs::remove_all(dir); }
};

llama::Config small() {
  return {.vocab_size = 16, .context_length = 8, .d_model = 16, .num_layers = 1, .num_heads = 2, .d_ff = 24};
}

}  // namespace

TEST(Evaluate, UniformModelGivesLogVAndPerplexityV) {
  // With a zero lm_head every logit is 0: each prediction costs exactly ln(16), perplexity 16.
  llama::TransformerLM model(small(), 1);
  model.parameter("lm_head.weight").value.zero_();
  std::vector<uint16_t> tokens(8 * 5 + 3);  // 5 complete windows of T=8 (+1 target), 2 tokens left over
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 16);
  TokenDir d(tokens);
  auto file = data::TokenFile::open((d.dir / "val.bin").string());
  auto r = train::evaluate(model, file);
  EXPECT_EQ(r.windows, 5);
  EXPECT_EQ(r.tokens, 40);
  EXPECT_NEAR(r.loss, std::log(16.0), 1e-6);
  EXPECT_NEAR(r.perplexity, 16.0, 1e-4);
  auto capped = train::evaluate(model, file, 4, 3);  // T=4, at most 3 windows
  EXPECT_EQ(capped.windows, 3);
  EXPECT_EQ(capped.tokens, 12);
  EXPECT_NE(r.to_json().find("\"perplexity\""), std::string::npos);
}

TEST(Evaluate, AveragesTheWindowsLossesAsComputedByHand) {
  llama::TransformerLM model(small(), 2);
  std::vector<uint16_t> tokens(8 * 3 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7 + 3) % 16);
  TokenDir d(tokens);
  auto r = train::evaluate(model, data::TokenFile::open((d.dir / "val.bin").string()), 8, 0, /*batch=*/2);
  // By hand: window k is tokens [8k, 8k+8] -> inputs [8k, 8k+8), targets [8k+1, 8k+9).
  double total = 0;
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> in, tg;
    for (int t = 0; t < 8; ++t) {
      in.push_back(tokens[static_cast<size_t>(8 * k + t)]);
      tg.push_back(tokens[static_cast<size_t>(8 * k + t + 1)]);
    }
    total += model.loss(Tensor::from_vector<int32_t>({1, 8}, in), Tensor::from_vector<int32_t>({1, 8}, tg)).item();
  }
  EXPECT_NEAR(r.loss, total / 3, 1e-5);
  EXPECT_NEAR(r.perplexity, std::exp(total / 3), 1e-3);
}

TEST(Evaluate, ErrorsNameTheProblem) {
  llama::TransformerLM model(small(), 3);
  TokenDir d(std::vector<uint16_t>(5, 1));  // fewer than one window of 9
  auto file = data::TokenFile::open((d.dir / "val.bin").string());
  EXPECT_THROW(train::evaluate(model, file), Error);
  EXPECT_THROW(train::evaluate(model, file, 9), Error);  // beyond the model's context
}
