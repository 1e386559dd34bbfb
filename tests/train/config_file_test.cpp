// Config files (train/config_file.h): a partial file takes its missing values from a named preset
// ("base", or "default"), and relative data paths resolve against the working directory, printed
// resolved by `loom train`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/cli_support.h"
#include "core/error.h"
#include "train/config.h"
#include "train/config_file.h"
#include "train/presets.h"

namespace fs = std::filesystem;
using loom::test::CliResult;
using loom::test::run_loom;
using loom::test::TempDir;
using loom::train::TrainConfig;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string load_error(const std::string& path) {
  try {
    TrainConfig::load(path);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ConfigFile, APartialFileTakesItsMissingValuesFromItsBasePreset) {
  TempDir dir("cfg_base");
  std::ofstream(dir.path / "mine.json") << R"({"base": "tiny", "training": {"max_steps": 3}, "model": {"num_layers": 3}})";
  TrainConfig c = TrainConfig::load(dir / "mine.json");
  TrainConfig tiny = TrainConfig::load("tiny");
  EXPECT_EQ(c.training.max_steps, 3);
  EXPECT_EQ(c.model.json()["num_layers"], 3);
  // Everything else is tiny's, not the struct defaults (which match no preset).
  nlohmann::json expected = tiny.to_json();
  expected["training"]["max_steps"] = 3;
  expected["model"]["num_layers"] = 3;
  EXPECT_EQ(c.to_json(), expected);
  // Written out, the resolved config is complete: it loads back the same with no base.
  TrainConfig back = TrainConfig::load(c.write(dir / "run"));
  EXPECT_EQ(back.to_json(), c.to_json());
}

TEST(ConfigFile, ABaseThatHasABaseGivesTheWholeChain) {
  TempDir dir("cfg_chain");
  // gpt2-medium states its shape and optimizer on gpt2-small, which states the data and precision.
  std::ofstream(dir.path / "mine.json") << R"({"base": "gpt2-medium", "training": {"max_steps": 3}})";
  TrainConfig c = TrainConfig::load(dir / "mine.json");
  nlohmann::json expected = TrainConfig::load("gpt2-medium").to_json();
  expected["training"]["max_steps"] = 3;
  EXPECT_EQ(c.to_json(), expected);
  EXPECT_EQ(c.data.tokenizer, TrainConfig::load("gpt2-small").data.tokenizer);
  EXPECT_EQ(c.model.json()["d_model"], 1024);
}

TEST(ConfigFile, WithoutABaseTheBuiltInDefaultsAreTheBaseAsForAPreset) {
  TempDir dir("cfg_default");
  std::ofstream(dir.path / "mine.json") << R"({"optimizer": {"lr": 0.5, "min_lr": 0}})";
  TrainConfig c = TrainConfig::load(dir / "mine.json");
  nlohmann::json expected = TrainConfig::defaults_json("llama");
  expected["optimizer"]["lr"] = 0.5;
  expected["optimizer"]["min_lr"] = 0;
  EXPECT_EQ(c.to_json(), TrainConfig::from_json(expected).to_json());
  // Another family without a base: that family's own model (GPT-2 small), with the file's changes.
  std::ofstream(dir.path / "gpt2.json") << R"({"model": {"arch": "gpt2", "num_layers": 2}})";
  TrainConfig g = TrainConfig::load(dir / "gpt2.json");
  EXPECT_EQ(g.model.arch(), "gpt2");
  EXPECT_EQ(g.model.json()["num_layers"], 2);
  EXPECT_EQ(g.model.json()["d_model"], TrainConfig::defaults_json("gpt2")["model"]["d_model"]);
}

TEST(ConfigFile, EveryPresetLoadsTheSameByPathAsByName) {
  for (const std::string& name : loom::train::preset_names()) {
    const std::string path = std::string(LOOM_SOURCE_DIR) + "/configs/" + name + ".json";
    EXPECT_EQ(TrainConfig::load(path).to_json(), TrainConfig::load(name).to_json()) << path;
  }
}

TEST(ConfigFile, BaseErrorsNameTheFileAndThePresets) {
  TempDir dir("cfg_errors");
  std::ofstream(dir.path / "unknown.json") << R"({"base": "huge"})";
  EXPECT_TRUE(has(load_error(dir / "unknown.json"), dir / "unknown.json" + " names base \"huge\", which is not a preset"))
      << load_error(dir / "unknown.json");
  EXPECT_TRUE(has(load_error(dir / "unknown.json"), "tiny")) << "lists the presets";
  std::ofstream(dir.path / "number.json") << R"({"base": 3})";
  EXPECT_TRUE(has(load_error(dir / "number.json"), "\"base\" must name a preset"));
  // A base of another family than the file's model.arch.
  std::ofstream(dir.path / "family.json") << R"({"base": "tiny", "model": {"arch": "gpt2"}})";
  const std::string family = load_error(dir / "family.json");
  EXPECT_TRUE(has(family, dir / "family.json")) << family;
  EXPECT_TRUE(has(family, "gpt2-small")) << family;
  std::ofstream(dir.path / "gpt2.json") << R"({"base": "gpt2-small", "model": {"num_layers": 2}})";
  EXPECT_EQ(TrainConfig::load(dir / "gpt2.json").model.arch(), "gpt2");
  // A complete file of another family needs no base (a run's config.json).
  TrainConfig g = TrainConfig::load(dir / "gpt2.json");
  EXPECT_EQ(TrainConfig::load(g.write(dir / "run")).to_json(), g.to_json());
}

TEST(ConfigFile, RelativeDataPathsResolveAgainstTheWorkingDirectoryAndArePrinted) {
  TempDir dir("cfg_paths");
  // The config sits in conf/; its relative data paths name files under the working directory.
  fs::create_directories(dir.path / "conf");
  std::ofstream(dir.path / "conf" / "run.json") << R"({"base": "tiny",
    "data": {"train": "tokens/train.bin", "val": "tokens/val.bin", "tokenizer": "tokens/tok.json"},
    "training": {"max_steps": 1, "batch_size": 2}, "eval": {"interval": 0}, "checkpoint": {"interval": 0},
    "sample": {"num_samples": 0}, "logging": {"progress": "none"}})";
  TrainConfig c = TrainConfig::load(dir / "conf/run.json");
  EXPECT_EQ(c.data.train, "tokens/train.bin");  // kept as written
  const auto lines = loom::train::describe_data_paths(c);
  ASSERT_EQ(lines.size(), 4u);
  const std::string cwd = fs::current_path().string();
  EXPECT_EQ(lines[2], "data.train = tokens/train.bin -> " + cwd + "/tokens/train.bin");

  // Token files under the working directory: `loom train --config conf/run.json` run there finds them and
  // says where they are.
  fs::create_directories(dir.path / "tokens");
  std::ofstream(dir.path / "tokens" / "meta.json") << R"({"dtype": "uint16", "vocab_size": 64})";
  for (const char* name : {"train.bin", "val.bin"}) {
    std::ofstream out(dir.path / "tokens" / name, std::ios::binary);
    for (int i = 0; i < 4000; ++i) {
      const uint16_t t = static_cast<uint16_t>(i % 64);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  CliResult r = run_loom({"train", "--config", "conf/run.json", "--out", "out"}, dir.path);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "data.train = tokens/train.bin -> " + (dir / "tokens/train.bin"))) << r.output;
  EXPECT_TRUE(fs::exists(dir.path / "out" / "model.safetensors"));
  // Run from elsewhere, the same file's paths point elsewhere, and the error says where it looked.
  TempDir other("cfg_paths_other");
  CliResult elsewhere = run_loom({"train", "--config", dir / "conf/run.json", "--out", "out"}, other.path);
  EXPECT_EQ(elsewhere.status, 1) << elsewhere.output;
  EXPECT_TRUE(has(elsewhere.output, "-> " + (other / "tokens/train.bin"))) << elsewhere.output;
}
