// Training configuration: presets, files, overrides and every rejection path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace fs = std::filesystem;
using loom::train::TrainConfig;
using nlohmann::json;

namespace {

// The error message of loading `preset` with `overrides`, or "" if it loaded.
std::string load_error(const std::vector<std::string>& overrides, const std::string& preset = "tiny") {
  try {
    TrainConfig::load(preset, overrides);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << "message: " << (msg)

}  // namespace

TEST(Config, PresetsHaveTheDocumentedShapes) {
  TrainConfig ts = TrainConfig::load("cs336-tinystories");
  EXPECT_EQ(ts.model.vocab_size(), 10000);
  EXPECT_EQ(ts.model.context_length(), 256);
  EXPECT_EQ(ts.model.json()["d_model"].get<int64_t>(), 512);
  EXPECT_EQ(ts.model.json()["num_layers"].get<int64_t>(), 4);
  EXPECT_EQ(ts.model.json()["num_heads"].get<int64_t>(), 16);
  EXPECT_EQ(ts.model.json()["d_ff"].get<int64_t>(), 1344);
  EXPECT_EQ(ts.model.json()["rope_theta"].get<float>(), 10000.0f);
  EXPECT_EQ(ts.tokens_per_step() * ts.training.max_steps, 327'680'000);
  TrainConfig tiny = TrainConfig::load("tiny");
  EXPECT_EQ(tiny.model.json()["d_model"].get<int64_t>(), 64);
  EXPECT_EQ(TrainConfig::load("").model.json(), TrainConfig::load("default").model.json());
}

TEST(Config, OverridesParseJsonOrFallBackToString) {
  TrainConfig c = TrainConfig::load(
      "tiny", {"optimizer.lr=0.01", "training.max_steps=7", "data.train=some/dir/train.bin", "sample.prompt=1984",
               "training.sampling=sequential", "training.seed=18446744073709551615", "model.norm_eps=1e-6",
               "sample.prompt=\"quoted\"", "training.batch_size=4.0"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.training.max_steps, 7);
  EXPECT_EQ(c.data.train, "some/dir/train.bin");
  EXPECT_EQ(c.sample.prompt, "quoted");  // the later override wins; a JSON string loses its quotes
  EXPECT_EQ(c.training.sampling, loom::data::Sampling::Sequential);
  EXPECT_EQ(c.training.seed, 18446744073709551615ull);
  EXPECT_FLOAT_EQ(c.model.json()["norm_eps"].get<float>(), 1e-6f);
  EXPECT_EQ(c.training.batch_size, 4);
  EXPECT_EQ(TrainConfig::load("tiny", {"sample.prompt=1984"}).sample.prompt, "1984");  // a string key keeps text
  auto [path, value] = loom::train::parse_override("a.b=[1, 2]");
  EXPECT_EQ(path, "a.b");
  EXPECT_EQ(value, json::array({1, 2}));
  EXPECT_EQ(loom::train::parse_override("x=not json").second, json("not json"));
}

TEST(Config, UnknownKeysAreRejectedByName) {
  EXPECT_ERROR_HAS(load_error({"optimizer.lrr=1"}), "unknown key optimizer.lrr");
  EXPECT_ERROR_HAS(load_error({"optimizer.lrr=1"}), "lr, min_lr");  // lists what the section has
  EXPECT_ERROR_HAS(load_error({"optimiser.lr=1"}), "unknown key optimiser");
  EXPECT_ERROR_HAS(load_error({"model.d_model.x=1"}), "model.d_model must be an integer");
  EXPECT_ERROR_HAS(load_error({"optimizer=3"}), "optimizer must be a JSON object");
  EXPECT_ERROR_HAS(load_error({"noequals"}), "section.key=value");
  EXPECT_ERROR_HAS(load_error({}, "no-such-preset"), "no preset named \"no-such-preset\"");
  EXPECT_ERROR_HAS(load_error({}, "no-such-preset"), "tiny");
}

TEST(Config, WrongTypesAreRejectedByName) {
  EXPECT_EQ(load_error({"optimizer.lr=abc"}), "config: optimizer.lr must be a number, got \"abc\"");
  EXPECT_ERROR_HAS(load_error({"training.max_steps=2.5"}), "training.max_steps must be an integer, got 2.5");
  EXPECT_ERROR_HAS(load_error({"training.batch_size=\"8\""}), "training.batch_size must be an integer");
  EXPECT_ERROR_HAS(load_error({"training.seed=-1"}), "training.seed must be a non-negative integer");
  EXPECT_EQ(TrainConfig::load("tiny", {"data.val=3"}).data.val, "3");
  EXPECT_ERROR_HAS(load_error({"logging.progress=fancy"}), "logging.progress must be");
  EXPECT_ERROR_HAS(load_error({"training.sampling=shuffle"}), "training.sampling must be \"random\" or");
}

TEST(Config, ImpossibleValuesAreRejectedByName) {
  struct Case {
    std::string set, needle;
  };
  for (const auto& c : std::vector<Case>{
           {"training.max_steps=0", "training.max_steps must be positive, got 0"},
           {"training.batch_size=-2", "training.batch_size must be positive"},
           {"training.grad_accum_steps=0", "training.grad_accum_steps"},
           {"training.threads=-1", "training.threads"},
           {"training.device=tpu", "training.device: unknown device 'tpu'"},
           {"training.device=cuda:x", "training.device"},
           {"optimizer.lr=-0.1", "optimizer.lr must be >= 0"},
           {"optimizer.min_lr=1", "optimizer.min_lr=1 must be at most optimizer.lr=0.003"},
           {"optimizer.beta1=1", "optimizer.beta1"},
           {"optimizer.beta2=-0.5", "optimizer.beta2"},
           {"optimizer.eps=0", "optimizer.eps must be positive"},
           {"optimizer.weight_decay=-1", "optimizer.weight_decay"},
           {"optimizer.grad_clip=-1", "optimizer.grad_clip"},
           {"schedule.warmup_steps=-1", "schedule.warmup_steps"},
           {"schedule.cosine_steps=-5", "schedule.cosine_steps"},
           {"model.d_model=65", "not divisible by model.num_heads=4"},
           {"model.num_heads=0", "num_heads=0"},
           {"model.vocab_size=0", "model.vocab_size must be positive"},
           {"model.context_length=-1", "model.context_length must be positive"},
           {"model.rope_theta=0", "model.rope_theta"},
           {"model.norm_eps=0", "model.norm_eps"},
           {"model.arch=mamba", "model.arch \"mamba\" is not a model family loom knows (families: \"llama\", \"gpt2\", \"deepseek_v3\")"},
           {"data.train=", "data.train must name"},
           {"data.val_fraction=1", "data.val_fraction"},
           {"eval.batches=0", "eval.batches"},
           {"eval.interval=-1", "eval.interval"},
           {"checkpoint.interval=-1", "checkpoint.interval"},
           {"checkpoint.keep_last=-1", "checkpoint.keep_last"},
           {"logging.interval=0", "logging.interval"},
           {"sample.temperature=-1", "sample.temperature"},
           {"sample.top_k=-1", "sample.top_k"},
           {"sample.top_p=0", "sample.top_p"},
       }) {
    std::string e = load_error({c.set});
    EXPECT_ERROR_HAS(e, c.needle) << " for --set " << c.set;
    EXPECT_EQ(e.rfind("config: ", 0), 0u) << e;
  }
  // Warmup longer than the run is allowed: the run just ends inside the warmup.
  EXPECT_EQ(load_error({"schedule.warmup_steps=1000", "training.max_steps=10"}), "");
}

TEST(Config, BatchLargerThanTheDataNamesTheKeys) {
  TrainConfig c = TrainConfig::load("tiny", {"training.batch_size=4", "model.context_length=32"});
  EXPECT_NO_THROW(c.check_data_size(129, 129));
  try {
    c.check_data_size(128, 1000);
    FAIL();
  } catch (const loom::Error& e) {
    std::string m = e.what();
    EXPECT_ERROR_HAS(m, "training.batch_size=4");
    EXPECT_ERROR_HAS(m, "model.context_length=32");
    EXPECT_ERROR_HAS(m, "data.train");
    EXPECT_ERROR_HAS(m, "holds 128");
  }
  try {
    c.check_data_size(1000, 50);
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_ERROR_HAS(std::string(e.what()), "data.val");
  }
  c.eval.interval = 0;  // no validation: the val file's size does not matter
  EXPECT_NO_THROW(c.check_data_size(1000, 50));
}

TEST(Config, FilesLoadPartiallyAndTheResolvedConfigRoundTrips) {
  fs::path dir = fs::temp_directory_path() / ("loom_trainkit_cfg_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "mine.json") << R"({"training": {"max_steps": 3}, "optimizer": {"lr": 0.5, "min_lr": 0}})";
  TrainConfig c = TrainConfig::load((dir / "mine.json").string(), {"training.batch_size=2"});
  EXPECT_EQ(c.training.max_steps, 3);
  EXPECT_EQ(c.training.batch_size, 2);
  EXPECT_EQ(c.model.json()["d_model"], TrainConfig::defaults_json()["model"]["d_model"]);  // the rest: the built-in defaults (no "base" key)

  std::string written = c.write((dir / "run").string());
  EXPECT_EQ(written, (dir / "run" / "config.json").string());
  TrainConfig back = TrainConfig::load(written);
  EXPECT_EQ(back.to_json(), c.to_json());
  std::ifstream in(written);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_ERROR_HAS(ss.str(), "\"norm_eps\": 1e-05");  // floats written in their short form

  std::ofstream(dir / "bad.json") << R"({"training": {"max_steps": 3,}})";
  EXPECT_ERROR_HAS(load_error({}, (dir / "bad.json").string()), "is not valid JSON");
  std::ofstream(dir / "list.json") << "[1, 2]";
  EXPECT_ERROR_HAS(load_error({}, (dir / "list.json").string()), "must be a JSON object");
  EXPECT_THROW(TrainConfig::load((dir / "missing.json").string()), loom::IoError);
  fs::remove_all(dir);
}
