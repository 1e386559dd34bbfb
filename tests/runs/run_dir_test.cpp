// Run directory ownership in process (runs/run_dir.h): which directories loom claims, what --overwrite
// deletes and what it leaves, the run.json marker, and the lock. The same promises through the real CLI
// are in run_dir_cli_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/file.h"
#include "runs/checkpoint.h"
#include "runs/run_dir.h"
#include "support/errors.h"
#include "support/files.h"

using namespace loom;
using loom::test::error_of;
using runs::ExistingRun;
using runs::RunDir;
using runs::RunKind;
using runs::RunState;
namespace fs = std::filesystem;
using loom::test::read_file;
using loom::test::TempDir;
using loom::test::write_file;

namespace {

// A checkpoint as loom writes it (manifest with sizes and hashes), holding one small file.
void write_loom_checkpoint(const fs::path& run, int64_t step) {
  runs::write_checkpoint(run.string(), step, {{"trainer_state.json", [](const std::string& path) {
                                                  io::write_file_atomically(path, [](io::FileWriter& w) { w.write("{}", 2); });
                                                }}});
}

nlohmann::json marker_json(const fs::path& run) { return nlohmann::json::parse(read_file(run / "run.json")); }

}  // namespace

TEST(RunDir, ANewDirectoryIsCreatedMarkedAndLocked) {
  TempDir tmp;
  const fs::path run = tmp.path / "a" / "run";
  {
    RunDir d = RunDir::claim(run.string(), RunKind::Train);
    EXPECT_TRUE(d.was_empty());
    EXPECT_TRUE(fs::is_directory(run));
    EXPECT_FALSE(fs::exists(run / "run.json")) << "claiming writes nothing but the lock";
    EXPECT_TRUE(d.start().empty());
    nlohmann::json m = marker_json(run);
    EXPECT_EQ(m["format"], "loom-run");
    EXPECT_EQ(m["kind"], "train");
    EXPECT_EQ(m["state"], "running");
    EXPECT_EQ(m["pid"], ::getpid());
    EXPECT_FALSE(m["created"].get<std::string>().empty());
    EXPECT_FALSE(m["loom_version"].get<std::string>().empty());
    d.finish(RunState::Finished, 42);
  }
  nlohmann::json m = marker_json(run);
  EXPECT_EQ(m["state"], "finished");
  EXPECT_EQ(m["step"], 42);
  auto marker = runs::read_run_marker(run.string());
  ASSERT_TRUE(marker);
  EXPECT_EQ(marker->state, RunState::Finished);
  EXPECT_EQ(marker->step, std::optional<int64_t>(42));
}

TEST(RunDir, AClaimThatIsNotStartedLeavesNoTrace) {
  TempDir tmp;
  const fs::path run = tmp.path / "new";
  { RunDir d = RunDir::claim(run.string(), RunKind::Import); }
  EXPECT_FALSE(fs::exists(run)) << "a command that failed before writing must not leave its directory behind";
  // An existing empty directory stays (it was the user's), holding only the lock file.
  fs::create_directories(run);
  { RunDir d = RunDir::claim(run.string(), RunKind::Import); }
  EXPECT_TRUE(fs::is_directory(run));
}

TEST(RunDir, AnExceptionAfterStartMarksTheRunFailed) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  try {
    RunDir d = RunDir::claim(run.string(), RunKind::Train);
    d.start();
    throw Error("something went wrong");
  } catch (const Error&) {
  }
  EXPECT_EQ(marker_json(run)["state"], "failed");
}

TEST(RunDir, ADirectoryThatIsNotLoomsIsNeverWrittenTo) {
  TempDir tmp;
  const fs::path mine = tmp.path / "mine";
  write_file(mine / "notes.txt", "my notes");
  write_file(mine / "model.safetensors", "not loom's");
  for (ExistingRun mode : {ExistingRun::Refuse, ExistingRun::Resume, ExistingRun::Overwrite}) {
    const std::string why = error_of([&] { RunDir::claim(mine.string(), RunKind::Train, mode); });
    EXPECT_NE(why.find("is not a loom run"), std::string::npos) << why;
    EXPECT_NE(why.find("model.safetensors, notes.txt"), std::string::npos) << "names what is there: " << why;
    EXPECT_NE(why.find("choose another --out"), std::string::npos) << "says what to do: " << why;
  }
  EXPECT_FALSE(fs::exists(mine / ".lock")) << "a refusal leaves nothing in the user's directory";
  EXPECT_EQ(read_file(mine / "notes.txt"), "my notes");

  // A file of the user's that happens to be called run.json is not a marker, and is not overwritten.
  const fs::path other = tmp.path / "other";
  write_file(other / "run.json", "{\"my\": \"data\"}");
  const std::string why = error_of([&] { RunDir::claim(other.string(), RunKind::Export, ExistingRun::Overwrite); });
  EXPECT_NE(why.find("not loom's run marker"), std::string::npos) << why;
  EXPECT_EQ(read_file(other / "run.json"), "{\"my\": \"data\"}");

  // A path that is a file.
  const std::string file_why = error_of([&] { RunDir::claim((mine / "notes.txt").string(), RunKind::Train); });
  EXPECT_NE(file_why.find("is not a directory"), std::string::npos) << file_why;
}

TEST(RunDir, LoomsOwnRunNeedsResumeOrOverwrite) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  {
    RunDir d = RunDir::claim(run.string(), RunKind::Train);
    d.start();
    write_file(run / "config.json", "{}");
    write_file(run / "metrics.jsonl", "{}\n");
    write_file(run / "model.safetensors", "weights");
    write_loom_checkpoint(run, 10);
    d.finish(RunState::Finished, 10);
  }
  // Without a flag: refused, saying what is there and what to do.
  const std::string why = error_of([&] { RunDir::claim(run.string(), RunKind::Train); });
  EXPECT_NE(why.find("a finished loom training run (step 10"), std::string::npos) << why;
  EXPECT_NE(why.find("--resume"), std::string::npos) << why;
  EXPECT_NE(why.find("--overwrite"), std::string::npos) << why;
  // import and export refuse it too, and --overwrite does not make them replace it: it replaces only the
  // writer's own kind of output (an export over a run would delete its checkpoints, issue 32).
  const std::string import_why = error_of([&] { RunDir::claim(run.string(), RunKind::Import); });
  EXPECT_NE(import_why.find("does not replace"), std::string::npos) << import_why;
  EXPECT_EQ(import_why.find("--resume"), std::string::npos) << import_why;
  for (RunKind other : {RunKind::Import, RunKind::Export}) {
    const std::string over = error_of([&] { RunDir::claim(run.string(), other, ExistingRun::Overwrite); });
    EXPECT_NE(over.find("replaces only what loom"), std::string::npos) << over;
  }
  EXPECT_EQ(read_file(run / "model.safetensors"), "weights");
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000010"));

  // --resume keeps everything and the run's creation time.
  const std::string created = marker_json(run)["created"];
  {
    RunDir d = RunDir::claim(run.string(), RunKind::Train, ExistingRun::Resume);
    EXPECT_FALSE(d.was_empty());
    ASSERT_TRUE(d.previous());
    EXPECT_EQ(d.previous()->state, RunState::Finished);
    EXPECT_TRUE(d.start().empty());
    EXPECT_EQ(marker_json(run)["state"], "running");
    EXPECT_EQ(marker_json(run)["created"], created);
    // With no valid checkpoint, a resume would start over: not in a directory that holds a run.
    const std::string restart = error_of([&] { d.check_nothing_to_resume(); });
    EXPECT_NE(restart.find("--overwrite"), std::string::npos) << restart;
    d.finish(RunState::Interrupted, 12);
  }
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000010"));

  // --overwrite deletes what loom wrote and nothing else.
  write_file(run / "notes.txt", "mine");
  write_file(run / "checkpoints" / "step_00000001" / "my_file.bin", "mine too");
  {
    RunDir d = RunDir::claim(run.string(), RunKind::Train, ExistingRun::Overwrite);
    std::vector<std::string> removed = d.start();
    EXPECT_EQ(removed, (std::vector<std::string>{"checkpoints/step_00000010", "config.json", "metrics.jsonl",
                                                 "model.safetensors"}));
    d.finish(RunState::Finished);
  }
  EXPECT_EQ(read_file(run / "notes.txt"), "mine");
  EXPECT_EQ(read_file(run / "checkpoints" / "step_00000001" / "my_file.bin"), "mine too");
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step_00000010"));
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
}

TEST(RunDir, ResumeIsForTrainingRunsOnly) {
  TempDir tmp;
  const fs::path run = tmp.path / "imported";
  {
    RunDir d = RunDir::claim(run.string(), RunKind::Import);
    d.start();
    write_file(run / "model.safetensors", "weights");
    d.finish(RunState::Finished);
  }
  const std::string why = error_of([&] { RunDir::claim(run.string(), RunKind::Train, ExistingRun::Resume); });
  EXPECT_NE(why.find("not a training run"), std::string::npos) << why;
}

TEST(RunDir, ATrainingRunFromBeforeRunJsonCanBeResumed) {
  TempDir tmp;
  const fs::path run = tmp.path / "legacy";
  write_file(run / "config.json", "{}");
  write_loom_checkpoint(run, 5);
  const std::string why = error_of([&] { RunDir::claim(run.string(), RunKind::Train); });
  EXPECT_NE(why.find("already holds a loom training run"), std::string::npos) << why;
  RunDir d = RunDir::claim(run.string(), RunKind::Train, ExistingRun::Resume);
  EXPECT_FALSE(d.was_empty());
  d.start();
  EXPECT_EQ(marker_json(run)["kind"], "train");
}

TEST(RunDir, ASecondWriterIsRefusedAtOnceNamingTheFirst) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  std::optional<RunDir> first(RunDir::claim(run.string(), RunKind::Train));
  first->start();
  // flock(2) locks belong to an open file description, so a second claim in this process conflicts too.
  for (ExistingRun mode : {ExistingRun::Refuse, ExistingRun::Resume, ExistingRun::Overwrite}) {
    const std::string why = error_of([&] { RunDir::claim(run.string(), RunKind::Train, mode); });
    EXPECT_NE(why.find("run directory " + run.string() + " is in use by process " + std::to_string(::getpid())),
              std::string::npos)
        << why;
  }
  first.reset();  // the lock goes with it
  EXPECT_EQ(marker_json(run)["state"], "failed");
  RunDir again = RunDir::claim(run.string(), RunKind::Train, ExistingRun::Resume);
  again.start();
}

TEST(RunDir, AMarkerLeftRunningByADeadProcessIsReported) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  write_file(run / "metrics.jsonl", "{}\n");
  write_file(run / "run.json", nlohmann::json{{"format", "loom-run"}, {"version", 1}, {"kind", "train"}, {"state", "running"},
                                         {"created", "2024-01-01T00:00:00Z"}, {"updated", "2024-01-01T00:00:00Z"},
                                         {"loom_version", "0.1.0"}, {"pid", 999999}, {"host", "elsewhere"}}
                                  .dump());
  const std::string why = error_of([&] { RunDir::claim(run.string(), RunKind::Train); });
  EXPECT_NE(why.find("ended without closing it"), std::string::npos) << why;
  EXPECT_NE(why.find("--resume"), std::string::npos) << why;
}
