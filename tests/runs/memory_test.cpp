// Memory is bounded before it is spent (runs/memory.h): absurd sizes from --set and from a weights file's
// metadata are refused in well under a second with a small peak RSS, naming the keys and the estimate in
// GiB; the estimator's terms and the --max-memory sizes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/cli_support.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "train/config.h"
#include "runs/memory.h"
#include "train/memory.h"
#include "runs/load.h"

namespace fs = std::filesystem;
using loom::test::CliResult;
using loom::test::run_loom;
using loom::test::TempDir;
using loom::runs::MemoryBudget;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

constexpr double kMaxSeconds = 1.0;
constexpr long kMaxRssKib = 200 * 1024;  // the CLI idles at ~10 MiB; a model or cache of GiBs cannot hide

void expect_refused_fast(const CliResult& r, const std::vector<std::string>& named) {
  // Linux carries the parent's peak RSS into a forked child's ru_maxrss across exec, so the measurement
  // only means something while this test process itself is small.
  struct rusage self {};
  ::getrusage(RUSAGE_SELF, &self);
  ASSERT_LT(self.ru_maxrss, kMaxRssKib / 2) << "the test process itself grew; the child's peak RSS cannot be measured";
  EXPECT_EQ(r.status, 1) << "signal " << r.signal << "\n" << r.output;
  EXPECT_LT(r.seconds, kMaxSeconds) << r.output;
  EXPECT_LT(r.max_rss_kib, kMaxRssKib) << r.output;
  EXPECT_TRUE(has(r.output, "GiB")) << r.output;
  for (const std::string& key : named) EXPECT_TRUE(has(r.output, key)) << key << " in:\n" << r.output;
}

}  // namespace

TEST(Memory, AbsurdSizesFromSetAreRefusedFastWithSmallRss) {
  TempDir dir("mem_set");
  // The data paths do not exist: the refusal must come before anything looks at (or makes) data.
  const std::vector<std::string> common = {"train", "--config", "tiny", "--out", dir / "run", "--set",
                                           "data.corpus=" + (dir / "none"), "--set", "data.train=" + (dir / "x/train.bin"),
                                           "--set", "data.val=" + (dir / "x/val.bin"), "--set",
                                           "data.tokenizer=" + (dir / "x/tok.json")};
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"model.num_layers=1000000", "model.num_layers=1000000"},
           {"model.d_model=4096000", "model.d_model=4096000"},
           {"eval.batches=1e9", "eval.batches=1000000000"},
           {"model.context_length=1000000000", "model.context_length=1000000000"}}) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--set", set});
    SCOPED_TRACE(set);
    expect_refused_fast(run_loom(args), {key, "train: needs an estimated"});
  }
  EXPECT_FALSE(fs::exists(dir.path / "run"));
  EXPECT_FALSE(fs::exists(dir.path / "x"));
}

TEST(Memory, AbsurdWeightsMetadataIsRefusedBeforeTheModelIsBuilt) {
  TempDir dir("mem_weights");
  auto tiny = loom::train::TrainConfig::load("tiny").model;
  // One small tensor, and metadata that claims a model of a million layers (or a 1e9-token context).
  for (const auto& [key, value] : std::vector<std::pair<std::string, int64_t>>{{"num_layers", 1000000},
                                                                              {"context_length", 1000000000}}) {
    SCOPED_TRACE(key);
    fs::create_directories(dir.path / key);
    const std::string path = dir / (key + "/model.safetensors");
    loom::io::write_safetensors(path, loom::io::NamedTensors{{"w", loom::Tensor::zeros({4})}},
                                {{"loom.model_config", tiny.with(key, value).json().dump()}});
    const std::string named = "model." + key + "=" + std::to_string(value);
    expect_refused_fast(run_loom({"generate", "--weights", path, "--prompt", "a"}), {named, path});
    // A token file that exists (the CLI checks its path when parsing), never read: the model is refused first.
    std::ofstream(dir / "none.bin").put('\0');
    expect_refused_fast(run_loom({"eval", "--weights", path, "--data", dir / "none.bin"}), {named, path});
    // In the library: the model alone (for `loom export`, Python's load_run) against a budget it exceeds.
    EXPECT_THROW(loom::runs::load_model_weights(path, MemoryBudget::parse("1G")), loom::Error);
  }
}

TEST(Memory, MaxMemoryIsTheBudgetWhenGiven) {
  TempDir dir("mem_budget");
  CliResult r = run_loom({"train", "--config", "tiny", "--out", dir / "run", "--max-memory", "50M", "--set",
                          "data.train=" + (dir / "x/train.bin"), "--set", "data.val=" + (dir / "x/val.bin")});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r.output, "--max-memory 50M")) << r.output;
  CliResult bad = run_loom({"train", "--config", "tiny", "--max-memory", "lots"});
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_TRUE(has(bad.output, "\"lots\"")) << bad.output;
  CliResult bench = run_loom({"bench", "train", "--preset", "tiny", "--batch", "100000000", "--steps", "1"});
  expect_refused_fast(bench, {"--batch=100000000"});
}

// `loom bench train` reports its own memory (the README's peak-RSS column): the process's peak, what it
// held before the model existed, and the tensors' peak. Weights, gradients and both AdamW moments (16
// bytes a parameter) are alive together after a step, so the tensor peak and the RSS growth cover them,
// and the process cannot have peaked above what the kernel measured for it from outside.
TEST(Memory, BenchTrainReportsItsPeakRss) {
  CliResult r = run_loom({"bench", "train", "--preset", "default", "--batch", "2", "--steps", "1", "--warmup", "0",
                          "--threads", "1"});
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string line = r.output.substr(r.output.rfind('{'));
  const nlohmann::json j = nlohmann::json::parse(line);
  const double start = j.at("start_rss_mib"), peak = j.at("peak_rss_mib"), tensors = j.at("tensor_peak_mib");
  const double weights_mib = 16.0 * j.at("params").get<double>() / (1 << 20);
  EXPECT_GT(start, 1) << line;
  EXPECT_GE(tensors, weights_mib) << line;
  EXPECT_GE(peak - start, weights_mib) << line;
  EXPECT_LT(tensors, peak) << line;
  EXPECT_LE(peak * 1024, static_cast<double>(r.max_rss_kib) + 1024) << line << " against wait4's " << r.max_rss_kib;
}

TEST(Memory, BudgetSizesParseWithBinaryUnits) {
  EXPECT_EQ(MemoryBudget::parse("8G").bytes, 8.0 * (1ull << 30));
  EXPECT_EQ(MemoryBudget::parse("512MiB").bytes, 512.0 * (1 << 20));
  EXPECT_EQ(MemoryBudget::parse("1.5GB").bytes, 1.5 * (1ull << 30));
  EXPECT_EQ(MemoryBudget::parse("4096").bytes, 4096.0);
  EXPECT_EQ(MemoryBudget::parse("2t").bytes, 2.0 * (1ull << 40));
  for (const char* bad : {"", "G", "-1G", "8X", "8GiBs", "nan"}) {
    EXPECT_THROW(MemoryBudget::parse(bad), loom::Error) << bad;
  }
  MemoryBudget machine = MemoryBudget::of_machine();
  EXPECT_GT(machine.bytes, 0);
  EXPECT_FALSE(machine.source.empty());
}

TEST(Memory, TheEstimateCountsWhatTrainingHolds) {
  const auto c = loom::train::TrainConfig::load("tiny");
  const double P = static_cast<double>(c.model.stats().total_params);
  const auto e = loom::train::training_memory(c);
  double weights = 0, validation = 0, activations = 0;
  for (const auto& t : e.terms) {
    if (t.what == "parameters, gradients and AdamW moments") weights = t.bytes;
    if (t.what == "validation batches") validation = t.bytes;
    if (t.what == "activations kept for backward") activations = t.bytes;
  }
  EXPECT_EQ(weights, 16 * P);  // f32 weights, gradients, two AdamW moments
  EXPECT_EQ(validation, 4.0 * 16 * 64 * 8);  // eval.batches x B x T x (inputs + targets, i32)
  EXPECT_EQ(activations, 16.0 * 64 * 64 * 2 * 24 * 4);  // B x T x d_model x layers x 24 values x 4 bytes
  // The default run measured 267 MiB peak RSS (README); the estimate must cover it without being absurd.
  const double mib = loom::train::training_memory(loom::train::TrainConfig::load("default")).total_bytes() / (1 << 20);
  EXPECT_GT(mib, 267);
  EXPECT_LT(mib, 2 * 267);
  // A config whose int64 parameter count would overflow is still counted as huge.
  const auto huge = c.model.with("d_model", int64_t{1} << 32).with("num_heads", 1);
  EXPECT_GT(loom::runs::model_memory(huge).total_bytes(), 1e19);
  EXPECT_THROW(loom::runs::check_memory(loom::runs::model_memory(huge), MemoryBudget::parse("1T"), "test"), loom::Error);
}
