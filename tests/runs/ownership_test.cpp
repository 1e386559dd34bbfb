// What retention and checkpoint writes may delete (only what loom wrote, never the last valid checkpoint),
// and the stops that the Ctrl-C handling adds: in the middle of a validation pass (redone on resume, the
// run still bitwise the uninterrupted one), and a non-finite validation loss (an error, not a number).
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "support/op_test.h"
#include "support/synthetic_corpus.h"
#include "runs/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "support/files.h"

using namespace loom;
namespace fs = std::filesystem;
using loom::test::read_file;
using loom::test::write_file;

namespace {

struct Corpus : test::SyntheticCorpusDir {
  Corpus() : SyntheticCorpusDir("loom_ownership_test") {}
  train::TrainConfig config(int64_t steps, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> o = {
        "model.vocab_size=64", "training.max_steps=" + std::to_string(steps), "training.batch_size=4",
        "model.context_length=32", "schedule.warmup_steps=5", "schedule.cosine_steps=40", "eval.interval=10",
        "eval.batches=2", "logging.interval=1", "logging.progress=none", "logging.peak_flops=1e11",
        "training.threads=1", "checkpoint.interval=10", "checkpoint.keep_last=1", "sample.num_samples=0",
        "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\"",
        "data.tokenizer=\"" + (dir / "no_tokenizer.json").string() + "\""};
    o.insert(o.end(), extra.begin(), extra.end());
    return train::TrainConfig::load("tiny", o);
  }
};

std::vector<int64_t> steps_of(const fs::path& run) {
  std::vector<int64_t> steps;
  for (const auto& c : runs::list_checkpoints(run.string())) steps.push_back(c.step);
  return steps;
}

}  // namespace

TEST(CheckpointOwnership, RetentionLeavesAFolderLoomDidNotWriteAlone) {
  Corpus corpus;
  const fs::path run = corpus.dir / "run";
  // The user keeps something of theirs under a name that looks like a checkpoint.
  write_file(run / "checkpoints" / "step_00000001" / "notes.txt", "my notes");
  train::Trainer t(corpus.config(30, {"checkpoint.keep_last=1"}), run.string());
  ASSERT_EQ(t.resume(), std::nullopt);  // the foreign folder is no checkpoint (and is skipped)
  t.run();
  EXPECT_EQ(read_file(run / "checkpoints" / "step_00000001" / "notes.txt"), "my notes");
  EXPECT_EQ(steps_of(run), (std::vector<int64_t>{1, 30})) << "keep_last=1 counts only loom's checkpoints";

  // A loom checkpoint into which the user put a file is no longer only loom's: it is not deleted either.
  fs::copy(run / "checkpoints" / "step_00000030", run / "checkpoints" / "step_00000020", fs::copy_options::recursive);
  {
    std::ifstream in(run / "checkpoints" / "step_00000020" / "manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    m["step"] = 20;
    std::ofstream(run / "checkpoints" / "step_00000020" / "manifest.json") << m.dump();
  }
  write_file(run / "checkpoints" / "step_00000020" / "my_eval.txt", "mine");
  EXPECT_FALSE(runs::checkpoint_written_by_loom((run / "checkpoints" / "step_00000020").string()));
  EXPECT_TRUE(runs::checkpoint_written_by_loom((run / "checkpoints" / "step_00000030").string()));
  EXPECT_TRUE(runs::apply_retention(run.string(), 1).empty());
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000020" / "my_eval.txt"));

  // Leftover-looking folders holding unknown files are not removed either; loom's own leftovers are.
  write_file(run / "checkpoints" / ".tmp-step_00000040-1" / "precious.bin", "x");
  write_file(run / "checkpoints" / ".tmp-step_00000050-2" / "model.safetensors", "partial");
  write_file(run / "checkpoints" / ".tmp-step_00000050-2" / ".trainer_state.json.tmp.123", "partial");
  runs::apply_retention(run.string(), 1);
  EXPECT_TRUE(fs::exists(run / "checkpoints" / ".tmp-step_00000040-1" / "precious.bin"));
  EXPECT_FALSE(fs::exists(run / "checkpoints" / ".tmp-step_00000050-2"));

  // Saving a step whose folder is the user's is an error, not a replacement.
  write_file(run / "checkpoints" / "step_00000040" / "notes.txt", "mine");
  train::Trainer more(corpus.config(40, {"checkpoint.keep_last=1"}), run.string());
  ASSERT_EQ(more.resume(), std::optional<int64_t>(30));
  try {
    more.run();
    ADD_FAILURE() << "expected the save of step 40 to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was not written by loom"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(run / "checkpoints" / "step_00000040" / "notes.txt"), "mine");
}

TEST(CheckpointOwnership, RetentionNeverDeletesTheLastValidCheckpoint) {
  Corpus corpus;
  const fs::path run = corpus.dir / "run";
  train::Trainer t(corpus.config(10, {"checkpoint.keep_last=0"}), run.string());
  t.run();
  const fs::path ck = run / "checkpoints";
  // Two newer checkpoints, both damaged (a flipped byte): with keep_last=2 they would be "the newest two".
  for (int step : {20, 30}) {
    const fs::path c = ck / runs::checkpoint_name(step);
    fs::copy(ck / "step_00000010", c, fs::copy_options::recursive);
    std::ifstream in(c / "manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    m["step"] = step;
    std::ofstream(c / "manifest.json") << m.dump();
    std::fstream f(c / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  ASSERT_TRUE(runs::checkpoint_problem((ck / "step_00000030").string()));
  EXPECT_TRUE(runs::apply_retention(run.string(), 2).empty());
  EXPECT_EQ(steps_of(run), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_FALSE(runs::checkpoint_problem((ck / "step_00000010").string()));
}

TEST(CheckpointOwnership, AStopDuringValidationIsRedoneOnResumeExactly) {
  Corpus corpus;
  const fs::path a = corpus.dir / "a", b = corpus.dir / "b";
  train::Trainer whole(corpus.config(30, {"checkpoint.keep_last=0"}), a.string());
  whole.run();
  {
    train::Trainer stopped(corpus.config(30, {"checkpoint.keep_last=0"}), b.string());
    train::StopSignal stop;
    stopped.after_backward = [&](int64_t step, std::vector<Tensor>&) {
      if (step == 9) stop.request();  // during step 10, whose end is a validation: that pass is interrupted
    };
    auto summary = stopped.run(&stop);
    EXPECT_TRUE(summary.stopped_early);
    EXPECT_EQ(summary.steps_completed, 10);
  }
  std::ifstream in(b / "checkpoints" / "step_00000010" / "trainer_state.json");
  EXPECT_EQ(nlohmann::json::parse(in)["val_pending"], true);
  for (const auto& e : train::read_metrics((b / "metrics.jsonl").string())) {
    EXPECT_FALSE(e.value("event", "") == "val" && e.value("step", 0) == 10) << "the interrupted pass logged a loss";
  }
  {
    // A resume that redoes the step-10 validation (logging it) and dies during step 11, before any newer
    // checkpoint: the next resume starts from the same val_pending checkpoint, redoes that validation
    // again, and must not leave the first one's line behind (the duplicate val event that
    // Checkpoint.KillNineAndResumeMatchesAnUninterruptedRun caught about once in eight loaded runs).
    train::Trainer dying(corpus.config(30, {"checkpoint.keep_last=0"}), b.string());
    ASSERT_EQ(dying.resume(), std::optional<int64_t>(10));
    dying.after_backward = [&](int64_t step, std::vector<Tensor>&) {
      if (step == 10) throw std::runtime_error("killed");
    };
    EXPECT_THROW(dying.run(), std::runtime_error);
    int val10 = 0;
    for (const auto& e : train::read_metrics((b / "metrics.jsonl").string())) {
      val10 += e.value("event", "") == "val" && e.value("step", 0) == 10;
    }
    ASSERT_EQ(val10, 1) << "the dying resume should have logged the redone validation";
  }
  train::Trainer resumed(corpus.config(30, {"checkpoint.keep_last=0"}), b.string());
  ASSERT_EQ(resumed.resume(), std::optional<int64_t>(10));
  EXPECT_FALSE(resumed.run().stopped_early);
  // Same metrics line for line (the step-10 validation included), same weights.
  auto strip_speed = [](const fs::path& run) {
    std::vector<nlohmann::json> out;
    for (auto e : train::read_metrics((run / "metrics.jsonl").string())) {
      e.erase("tokens_per_s");
      e.erase("mfu");
      out.push_back(e);
    }
    return out;
  };
  EXPECT_EQ(strip_speed(a), strip_speed(b));
  EXPECT_EQ(read_file(a / "checkpoints" / "step_00000030" / "model.safetensors"),
            read_file(b / "checkpoints" / "step_00000030" / "model.safetensors"));
}

TEST(CheckpointOwnership, ANonFiniteValidationLossIsAnError) {
  Corpus corpus;
  train::Trainer t(corpus.config(10), (corpus.dir / "run").string());
  Tensor& w = t.model().parameters().front()->value;
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = std::nanf("");
  try {
    t.run();
    ADD_FAILURE() << "expected a non-finite validation loss to stop the run";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("validation loss at step 0 is"), std::string::npos) << what;
    EXPECT_NE(what.find("not finite"), std::string::npos) << what;
  }
}
