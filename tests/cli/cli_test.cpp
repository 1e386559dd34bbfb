// The thin CLI commands end to end: `loom flops`, `loom config`, `loom plot`, `loom corpus austen` (errors
// only; the extraction itself is tested in corpus_test.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/cli.h"
#include "train/config.h"
#include "train/metrics.h"

using Result = loom::test::CliRun;
using loom::test::run_cli;

namespace fs = std::filesystem;


TEST(Cli, FlopsPrintsJsonForAPresetWithOverrides) {
  Result r = run_cli("flops --config tiny --set model.num_layers=3 --tokens-per-s 1000 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  // tiny with 3 layers: 512*64 embedding + 3*(4*64*64 + 3*64*192 + 128) + 64 + 512*64 lm_head.
  EXPECT_EQ(j["total_params"], 32768 + 3 * (16384 + 36864 + 128) + 64 + 32768);
  EXPECT_EQ(j["tokens_per_s"], 1000.0);
  Result bad = run_cli("flops --config tiny --set optimizer.lr=abc");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("error: config: optimizer.lr must be a number, got \"abc\""), std::string::npos)
      << bad.output;
}

TEST(Cli, ConfigPrintsAPresetResolvedInFull) {
  // Printed, a preset has every key, its bases' included (gpt2-medium states a dozen on gpt2-small).
  Result r = run_cli("config --config gpt2-medium --set training.max_steps=3", /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j, loom::train::TrainConfig::load("gpt2-medium", {"training.max_steps=3"}).to_json());
  EXPECT_EQ(j["data"]["tokenizer"], "data/gpt2");
  EXPECT_EQ(j["training"]["max_steps"], 3);
  Result bad = run_cli("config --config no-such-preset");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("no preset named \"no-such-preset\""), std::string::npos) << bad.output;
}

TEST(Cli, PlotWritesSvgsAndFlopsReadsTheRunsThroughput) {
  fs::path dir = fs::temp_directory_path() / ("loom_trainkit_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    loom::train::MetricsWriter w(dir.string());
    for (int s = 1; s <= 5; ++s) w.train({s, 5.0 - s * 0.5, 1e-3, 1, 100.0 * s, 0});
    w.val({5, 3.0});
  }
  Result r = run_cli("plot " + dir.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "loss.svg"));
  EXPECT_TRUE(fs::exists(dir / "lr.svg"));
  // Median of 200..500 after dropping the first interval: 400 (upper median of 4).
  Result f = run_cli("flops --config tiny --run " + dir.string() + " --json");
  ASSERT_EQ(f.status, 0) << f.output;
  EXPECT_EQ(nlohmann::json::parse(f.output)["tokens_per_s"], 400.0);
  fs::remove_all(dir);
  Result missing = run_cli("plot " + dir.string());
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("metrics.jsonl"), std::string::npos) << missing.output;
}

TEST(Cli, CorpusExplainsWhereToGetThePackage) {
  Result r = run_cli("corpus austen --rdata /nonexistent/dir --out /tmp/unused");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("tools/get_corpus.sh"), std::string::npos) << r.output;
}
