// Opening a run's data from its config: the checks that need the files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "train/run_data.h"

namespace fs = std::filesystem;
using loom::train::TrainConfig;

namespace {
struct Prepared {
  fs::path dir = fs::temp_directory_path() / ("loom_trainkit_rundata_" + std::to_string(::getpid()));
  Prepared(int64_t train_tokens, int64_t val_tokens, int vocab) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    write(dir / "train.bin", train_tokens);
    write(dir / "val.bin", val_tokens);
    std::ofstream(dir / "meta.json") << "{\"dtype\": \"uint16\", \"vocab_size\": " << vocab << "}";
  }
  ~Prepared() { fs::remove_all(dir); }
  static void write(const fs::path& p, int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 500);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * 2));
  }
  TrainConfig config(std::vector<std::string> extra = {}) const {
    extra.push_back("data.train=" + (dir / "train.bin").string());
    extra.push_back("data.val=" + (dir / "val.bin").string());
    return TrainConfig::load("tiny", extra);  // tiny: vocab 512, T 64, batch 16
  }
};

std::string error_of(const TrainConfig& c) {
  try {
    loom::train::open_run_data(c);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(RunData, OpensLoadersWithIndependentTrainAndValStreams) {
  Prepared p(20000, 5000, 500);
  auto d = loom::train::open_run_data(p.config());
  EXPECT_EQ(d.train.batch_size(), 16);
  EXPECT_EQ(d.train.context_length(), 64);
  ASSERT_TRUE(d.val.has_value());
  EXPECT_EQ(d.meta.vocab_size, 500);
  // Same seed, different streams for train and val.
  loom::RngKey root = loom::RngKey::from_seed(1337);
  EXPECT_EQ(d.train.next_starts(), loom::data::random_starts(root.fold_in("train").fold_in(uint64_t{0}), 20000, 16, 64));
  EXPECT_EQ(d.val->next_starts(), loom::data::random_starts(root.fold_in("val").fold_in(uint64_t{0}), 5000, 16, 64));
  auto no_eval = loom::train::open_run_data(p.config({"eval.interval=0"}));
  EXPECT_FALSE(no_eval.val.has_value());
}

TEST(RunData, DataErrorsNameTheConfigKeys) {
  Prepared p(20000, 500, 500);
  std::string small_val = error_of(p.config());
  EXPECT_NE(small_val.find("data.val"), std::string::npos) << small_val;
  EXPECT_NE(small_val.find("holds 500"), std::string::npos) << small_val;
  EXPECT_EQ(error_of(p.config({"eval.interval=0"})), "");  // no validation: the small file is fine
  std::string big_batch = error_of(p.config({"training.batch_size=400", "eval.interval=0"}));
  EXPECT_NE(big_batch.find("training.batch_size=400"), std::string::npos) << big_batch;
  std::string vocab = error_of(p.config({"model.vocab_size=256", "eval.interval=0"}));
  EXPECT_NE(vocab.find("model.vocab_size=256"), std::string::npos) << vocab;
  EXPECT_NE(vocab.find("vocab_size=500"), std::string::npos) << vocab;
  TrainConfig missing = p.config();
  missing.data.train = (p.dir / "nope" / "train.bin").string();
  EXPECT_NE(error_of(missing).find("meta.json"), std::string::npos);
  TrainConfig missing_val = p.config();
  missing_val.data.val = (p.dir / "nope.bin").string();
  EXPECT_NE(error_of(missing_val).find("data.val"), std::string::npos) << error_of(missing_val);
}
