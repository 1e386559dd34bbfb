// A GPT-2 run through the CLI, end to end with GPT-2's own tokenizer: train (with dropout) on a slice of
// Austen, the seed's greedy smoke test, eval, export as GPT2LMHeadModel, and the exported directory
// giving the same greedy text and loss through --weights.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/cli.h"

using Result = loom::test::CliRun;
using loom::test::run_cli;

namespace fs = std::filesystem;


TEST(Gpt2Cli, TrainGenerateEvalExportAndTheExportAgain) {
  const fs::path vocab = fs::path(LOOM_SOURCE_DIR) / "data" / "gpt2";
  const fs::path novel = fs::path(LOOM_SOURCE_DIR) / "data" / "austen" / "emma.txt";
  ASSERT_TRUE(fs::exists(vocab / "vocab.json") && fs::exists(novel))
      << "tools/setup.sh installs GPT-2's vocabulary (data/gpt2) and the Austen corpus (data/austen)";
  const fs::path tmp = fs::temp_directory_path() / ("loom_gpt2_cli_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "corpus");
  {
    std::ifstream in(novel);
    std::string text(200000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    std::ofstream(tmp / "corpus" / "emma.txt") << text;
  }
  const std::string run_dir = (tmp / "run").string(), data = (tmp / "tok").string();
  Result train = run_cli("train --config gpt2-austen --out " + run_dir + " --set data.corpus=" + (tmp / "corpus").string() +
                     " --set data.tokenizer=" + vocab.string() + " --set data.train=" + data + "/train.bin" +
                     " --set data.val=" + data + "/val.bin --set model.context_length=32 --set model.d_model=32" +
                     " --set model.num_layers=1 --set model.num_heads=2 --set training.max_steps=20" +
                     " --set training.batch_size=4 --set eval.interval=10 --set eval.batches=2" +
                     " --set checkpoint.interval=10 --set sample.num_samples=0 --set logging.progress=none" +
                     " --set logging.peak_flops=1e11");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_TRUE(fs::exists(tmp / "run" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "run" / "tokenizer.json"));  // converted from vocab.json + merges.txt

  const std::string smoke = " --prompt \"Every effort moves you\" --max-new-tokens 20 --temperature 0";
  Result text = run_cli("generate --run " + run_dir + smoke, /*with_stderr=*/false);
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_EQ(text.output.rfind("Every effort moves you", 0), 0u) << text.output;
  EXPECT_GT(text.output.size(), std::string("Every effort moves you\n").size());

  Result eval = run_cli("eval --run " + run_dir + " --data " + data + "/val.bin", /*with_stderr=*/false);
  ASSERT_EQ(eval.status, 0) << eval.output;
  const double loss = nlohmann::json::parse(eval.output)["loss"].get<double>();
  EXPECT_LT(loss, std::log(50257.0));

  const std::string hf = (tmp / "hf").string();
  Result exported = run_cli("export --run " + run_dir + " --format hf --out " + hf);
  ASSERT_EQ(exported.status, 0) << exported.output;
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(tmp / "hf" / f)) << f;
  }
  Result again = run_cli("generate --weights " + hf + smoke, /*with_stderr=*/false);
  EXPECT_EQ(again.output, text.output) << "greedy text through the exported GPT2LMHeadModel directory";
  Result eval_hf = run_cli("eval --weights " + hf + " --data " + data + "/val.bin", /*with_stderr=*/false);
  ASSERT_EQ(eval_hf.status, 0) << eval_hf.output;
  EXPECT_NEAR(nlohmann::json::parse(eval_hf.output)["loss"].get<double>(), loss, 1e-6);
  fs::remove_all(tmp);
}
