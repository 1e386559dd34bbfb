// The training loop on a small synthetic corpus: metrics, determinism, the non-finite skip path,
// validation, a clean stop.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/op_test.h"
#include "support/synthetic_corpus.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

struct TempRun : test::SyntheticCorpusDir {
  TempRun() : SyntheticCorpusDir("loom_trainer_test") {}
  train::TrainConfig config(int64_t steps) const {
    return train::TrainConfig::load(
        "tiny", {"model.vocab_size=64", "training.max_steps=" + std::to_string(steps), "training.batch_size=4",
                 "model.context_length=32", "schedule.warmup_steps=5", "eval.interval=10", "eval.batches=2",
                 "logging.interval=5", "logging.progress=none", "logging.peak_flops=1e11", "checkpoint.interval=0",
                 "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\""});
  }
};

std::vector<double> losses_of(const fs::path& metrics) {
  std::vector<double> out;
  for (const auto& e : train::read_metrics(metrics.string())) {
    if (e.value("event", "") == "train") out.push_back(e.at("loss").get<double>());
  }
  return out;
}

}  // namespace

TEST(Trainer, WritesMetricsAndLearns) {
  TempRun run;
  train::Trainer trainer(run.config(60), (run.dir / "run").string());
  auto summary = trainer.run();
  EXPECT_EQ(summary.steps_completed, 60);
  EXPECT_EQ(summary.steps_skipped, 0);
  ASSERT_TRUE(summary.first_val_loss && summary.last_val_loss);
  EXPECT_LT(*summary.last_val_loss, *summary.first_val_loss - 1.0) << "validation loss should fall";
  auto events = train::read_metrics((run.dir / "run" / "metrics.jsonl").string());
  int train_events = 0, val_events = 0;
  for (const auto& e : events) {
    if (e.value("event", "") == "train") {
      ++train_events;
      EXPECT_TRUE(e.contains("step") && e.contains("loss") && e.contains("lr") && e.contains("grad_norm") &&
                  e.contains("tokens_per_s") && e.contains("mfu"));
    }
    if (e.value("event", "") == "val") {
      ++val_events;
      EXPECT_TRUE(e.contains("step") && e.contains("val_loss"));
    }
  }
  EXPECT_EQ(train_events, 12);  // every 5 steps
  EXPECT_EQ(val_events, 7);     // step 0 and every 10 steps
  EXPECT_TRUE(fs::exists(run.dir / "run" / "config.json"));
}

TEST(Trainer, Bf16MixedPrecisionLearnsToo) {
  TempRun run;
  auto config = run.config(60);
  config.training.precision = "bf16";
  train::Trainer trainer(config, (run.dir / "run").string());
  auto summary = trainer.run();
  ASSERT_TRUE(summary.first_val_loss && summary.last_val_loss);
  EXPECT_LT(*summary.last_val_loss, *summary.first_val_loss - 1.0);
  EXPECT_EQ(trainer.model().parameter("lm_head.weight").value.dtype(), DType::F32);  // f32 master weights
}

TEST(Trainer, SameSeedGivesBitwiseIdenticalLosses) {
  TempRun run;
  train::Trainer a(run.config(20), (run.dir / "a").string());
  a.run();
  train::Trainer b(run.config(20), (run.dir / "b").string());
  b.run();
  auto la = losses_of(run.dir / "a" / "metrics.jsonl"), lb = losses_of(run.dir / "b" / "metrics.jsonl");
  ASSERT_EQ(la.size(), 4u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "event " << i;  // bitwise
}

TEST(Trainer, NonFiniteGradientSkipsTheStepAndCountsIt) {
  TempRun run;
  train::Trainer trainer(run.config(6), (run.dir / "run").string());
  std::vector<float> before;
  trainer.after_backward = [&](int64_t step, std::vector<Tensor>& grads) {
    if (step == 3) {
      before = trainer.model().parameter("lm_head.weight").value.to_vector<float>();
      grads.back().data<float>()[0] = std::nanf("");
    }
  };
  int64_t optimizer_steps_before = 0;
  auto summary = trainer.run();
  EXPECT_EQ(summary.steps_skipped, 1);
  EXPECT_EQ(summary.steps_completed, 6);
  EXPECT_EQ(trainer.optimizer().step_count(), 5 + optimizer_steps_before);  // 6 steps, one not applied
  int skips = 0;
  for (const auto& e : train::read_metrics((run.dir / "run" / "metrics.jsonl").string())) {
    if (e.value("event", "") == "skip") {
      ++skips;
      EXPECT_EQ(e.at("step").get<int64_t>(), 4);
    }
  }
  EXPECT_EQ(skips, 1);
}

TEST(Trainer, StopRequestEndsAfterTheCurrentStep) {
  TempRun run;
  train::Trainer trainer(run.config(50), (run.dir / "run").string());
  train::StopSignal stop;
  trainer.after_backward = [&](int64_t step, std::vector<Tensor>&) {
    if (step == 7) stop.request();
  };
  auto summary = trainer.run(&stop);
  EXPECT_TRUE(summary.stopped_early);
  EXPECT_EQ(summary.steps_completed, 8);
}

TEST(Trainer, DataErrorsNameTheKey) {
  TempRun run;
  auto config = run.config(5);
  config.data.train = (run.dir / "missing.bin").string();
  try {
    train::Trainer t(config, (run.dir / "run").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.train"), std::string::npos) << e.what();
  }
  config = run.config(5);
  config.model = config.model.with("vocab_size", 32);  // the data holds ids up to 60
  try {
    train::Trainer t(config, (run.dir / "run").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}
