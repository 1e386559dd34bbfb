// The config reader on hostile input: JSON nested past io/json.h's limit, huge values in messages,
// numbers past what a key's type holds, thread counts past kMaxThreads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "io/json.h"
#include "support/op_test.h"
#include "train/config.h"

namespace fs = std::filesystem;
using loom::train::TrainConfig;
using nlohmann::json;

namespace {

using loom::test::error_of;

const std::string kDeep = std::string(70000, '[') + std::string(70000, ']');

class ConfigFileLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("loom_config_limits_" + std::to_string(::getpid()) + ".json");
  }
  void TearDown() override { fs::remove(path_); }
  std::string write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_.string();
  }
  fs::path path_;
};

}  // namespace

TEST_F(ConfigFileLimits, DeepJsonIsRefusedQuicklyNamingTheFile) {
  // ~70,000 levels used to overflow the stack in the error message's dump() (`loom train` segfaulted).
  for (const std::string& text : {"{\"model\": " + kDeep + "}", kDeep, "{\"model\": {\"d_model\": " + kDeep + "}}"}) {
    const std::string path = write(text);
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { TrainConfig::load(path); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_HAS(msg, "config: " + path + " nests JSON arrays/objects more than 64 levels deep");
  }
}

TEST_F(ConfigFileLimits, AnOversizedFileIsRefused) {
  const std::string path = write("{\"description\": \"" + std::string(17 << 20, 'x') + "\"}");
  EXPECT_HAS(error_of([&] { TrainConfig::load(path); }), "bytes, over loom's limit of 16777216 bytes");
}

TEST(ConfigLimits, DeepOverrideValuesAreStringsNotCrashes) {
  // Not JSON within the limits: the text is taken as a plain string, then refused by the key's type.
  const std::string msg = error_of([] { TrainConfig::load("tiny", {"model.d_model=" + kDeep}); });
  EXPECT_HAS(msg, "config: model.d_model must be an integer, got \"[[[[");
  EXPECT_LT(msg.size(), 200u);
}

TEST(ConfigLimits, MessagesQuoteAShortPrefixOfTheValue) {
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  for (const json& value : {big, json(std::string(1 << 20, 'v')), json{{"k", big}}}) {
    const std::string msg = error_of([&] { TrainConfig::from_json(json{{"model", {{"d_model", value}}}}); });
    EXPECT_HAS(msg, "config: model.d_model must be an integer, got ");
    EXPECT_LT(msg.size(), 160u) << msg.substr(0, 300);
  }
  // The whole configuration of the wrong kind, and an unknown key as long as a book.
  EXPECT_LT(error_of([&] { TrainConfig::from_json(big); }).size(), 160u);
  const std::string unknown = error_of([] { TrainConfig::from_json(json{{std::string(1 << 20, 'k'), 1}}); });
  EXPECT_HAS(unknown, "config: unknown key kkkk");
  EXPECT_LT(unknown.size(), 400u);
}

TEST(ConfigLimits, UnsignedKeysRefuseNumbersPast2To64) {
  // training.seed is a uint64: 1e30 used to be converted anyway (undefined behaviour: any seed at all).
  EXPECT_HAS(error_of([] { TrainConfig::from_json(json::parse(R"({"training": {"seed": 1e30}})")); }),
             "config: training.seed must be a non-negative integer, got 1e+30");
  const json two_to_64 = json::parse(R"({"training": {"seed": 18446744073709551616.0}})");
  EXPECT_HAS(error_of([&] { TrainConfig::from_json(two_to_64); }), "training.seed must be a non-negative integer");
  EXPECT_EQ(TrainConfig::from_json(json::parse(R"({"training": {"seed": 1e19}})")).training.seed,
            10000000000000000000ull);
}

TEST(ConfigLimits, ThreadsAreBounded) {
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"training.threads=100000"}); }),
             "config: training.threads must be in [0, 1024] (0: every core), got 100000");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"training.threads=-1"}); }), "got -1");
  EXPECT_EQ(TrainConfig::load("tiny", {"training.threads=1024"}).training.threads, 1024);
}

TEST(ConfigLimits, SampleMaxNewTokensIsBounded) {
  // Checked with the config, not when the samples are drawn after hours of training.
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"sample.max_new_tokens=1000001"}); }),
             "config: sample.max_new_tokens must be in [0, 1000000], got 1000001");
  EXPECT_EQ(TrainConfig::load("tiny", {"sample.max_new_tokens=1000000"}).sample.max_new_tokens, 1000000);
}

TEST(ConfigLimits, PipeSettingsAreCheckedWithTheConfig) {
  // tiny has 2 blocks: a third stage would have none.
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.mesh=pipe=3"}); }),
             "pipe=3 needs at least as many blocks, but model.num_layers is 2");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.schedule=zb"}); }),
             "unknown parallel.schedule \"zb\": expected 1f1b, gpipe or interleaved");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.pipe_layers=2,1"}); }),
             "parallel.pipe_layers=\"2,1\" holds 3 blocks, but the model has 2");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.pipe_layers=1,1"}); }),
             "sets the stages of a pipe axis, but the mesh data=1,tensor=1 has none");
  const TrainConfig c = TrainConfig::load("tiny", {"parallel.mesh=pipe=2,data=2", "parallel.schedule=gpipe",
                                                   "parallel.pipe_layers=1,1"});
  EXPECT_EQ(c.parallel.schedule, "gpipe");
  EXPECT_EQ(c.parallel.pipe_layers, "1,1");
  // Interleaved 1F1B: two or more stages per rank, P x v blocks, micro-batches a multiple of P.
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.schedule=interleaved"}); }),
             "the interleaved schedule needs parallel.virtual_stages >= 2 (stages per rank), got 1");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.virtual_stages=2"}); }),
             "parallel.virtual_stages=2 needs parallel.schedule \"interleaved\", not \"1f1b\"");
  EXPECT_HAS(error_of([] {
               TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.schedule=interleaved",
                                          "parallel.virtual_stages=2", "model.num_layers=4", "training.grad_accum_steps=3"});
             }),
             "training.grad_accum_steps=3 is not a multiple of it");
  EXPECT_HAS(error_of([] {
               TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.schedule=interleaved",
                                          "parallel.virtual_stages=2", "training.grad_accum_steps=2"});
             }),
             "pipe=2 x parallel.virtual_stages=2 needs at least as many blocks, but model.num_layers is 2");
  EXPECT_HAS(error_of([] { TrainConfig::load("tiny", {"parallel.virtual_stages=2"}); }),
             "parallel.virtual_stages=2 sets the stages per rank of a pipe axis, but the mesh data=1,tensor=1 has none");
  const TrainConfig i = TrainConfig::load("tiny", {"parallel.mesh=pipe=2", "parallel.schedule=interleaved",
                                                   "parallel.virtual_stages=2", "model.num_layers=4",
                                                   "training.grad_accum_steps=4", "parallel.pipe_layers=1,1,1,1"});
  EXPECT_EQ(i.parallel.virtual_stages, 2);
}
