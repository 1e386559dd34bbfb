// docs/guarantees.md through the real `loom` binary: a run directory is never overwritten or deleted
// without --resume/--overwrite (train, resume, import, export), one writer at a time (a second one fails at
// once naming the first's pid; kill -9 leaves no stale lock), Ctrl-C and SIGTERM stop within a bounded time
// with an honest summary and exit status, and the exit statuses of the usage and user errors.
// Each test trains the tiny preset for a few steps on a synthetic corpus in its own temp directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/safetensors.h"
#include "support/synthetic_corpus.h"
#include "runs/checkpoint.h"
#include "train/metrics.h"
#include "support/files.h"

namespace fs = std::filesystem;
using loom::test::read_file;
using loom::test::write_file;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  int status;          // the exit status; -1 when killed by a signal
  std::string output;  // stdout and stderr
  std::string stdout_only;
};

// A running `loom`, its stdout and stderr going to `log`.
struct Process {
  pid_t pid = -1;
  fs::path log;

  // Waits up to `limit`; the exit status (-1 for a signal), or nullopt if it is still running.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    int st = 0;
    while (Clock::now() < deadline) {
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }
  // Waits until the log contains `text` (true) or `limit` passes or the process ends (false).
  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (read_file(log).find(text) != std::string::npos) return true;
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return read_file(log).find(text) != std::string::npos;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  ~Process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

Process spawn(const std::vector<std::string>& args, const fs::path& log,
              const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Process p;
  p.log = log;
  p.pid = ::fork();
  if (p.pid == 0) {
    std::FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<std::string> full = {LOOM_CLI};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : full) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return p;
}

// A temp folder with the synthetic corpus, and `loom` invocations that train the tiny preset on it.
struct Fixture : loom::test::SyntheticCorpusDir {
  Fixture() : SyntheticCorpusDir("loom_run_dir_cli") {}

  std::vector<std::string> train_args(const fs::path& out, int64_t steps, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"train", "--config", "tiny", "--out", out.string()};
    for (const std::string& s : std::vector<std::string>{
             "model.vocab_size=64", "model.context_length=32", "training.batch_size=4", "training.threads=1",
          "training.max_steps=" + std::to_string(steps), "schedule.warmup_steps=2", "eval.interval=4",
          "eval.batches=2", "logging.interval=1", "logging.progress=none", "logging.peak_flops=1e11",
          "checkpoint.interval=2", "checkpoint.keep_last=2", "sample.num_samples=0",
          "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\"",
          "data.tokenizer=\"" + (dir / "no_tokenizer.json").string() + "\""}) {
      a.push_back("--set");
      a.push_back(s);
    }
    for (const std::string& s : extra) a.push_back(s);
    return a;
  }

  // Runs `loom args...` to the end.
  Result run(const std::vector<std::string>& args) const {
    static int counter = 0;
    const fs::path log = dir / ("run_" + std::to_string(counter++) + ".log");
    const fs::path out = fs::path(log).replace_extension(".out");
    std::string cmd = std::string(LOOM_CLI);
    for (const std::string& a : args) cmd += " '" + a + "'";
    cmd += " >" + out.string() + " 2>" + log.string();
    const int st = std::system(cmd.c_str());
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_file(out) + read_file(log), read_file(out)};
  }

  fs::path log(const std::string& name) const { return dir / (name + ".log"); }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string state_of(const fs::path& run) {
  return nlohmann::json::parse(read_file(run / "run.json")).value("state", "");
}

// The metrics without the timing fields, which differ from run to run.
std::vector<nlohmann::json> curve(const fs::path& run) {
  std::vector<nlohmann::json> out;
  for (auto e : loom::train::read_metrics((run / "metrics.jsonl").string())) {
    e.erase("tokens_per_s");
    e.erase("mfu");
    out.push_back(e);
  }
  return out;
}

}  // namespace

TEST(RunDirCli, TrainNeverOverwritesARunOrAUsersFiles) {
  Fixture f;
  const fs::path run = f.dir / "run";
  // Checkpoints off: the old guard looked only at checkpoints/ and let this run be overwritten.
  Result first = f.run(f.train_args(run, 3, {"--set", "checkpoint.interval=0"}));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(state_of(run), "finished");
  const std::string model = read_file(run / "model.safetensors"), metrics = read_file(run / "metrics.jsonl");

  Result again = f.run(f.train_args(run, 5, {"--set", "checkpoint.interval=0", "--set", "training.seed=7"}));
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_TRUE(contains(again.output, "already holds a finished loom training run (step 3")) << again.output;
  EXPECT_TRUE(contains(again.output, "--resume") && contains(again.output, "--overwrite")) << again.output;
  EXPECT_EQ(read_file(run / "model.safetensors"), model);
  EXPECT_EQ(read_file(run / "metrics.jsonl"), metrics);

  // Directories of the user's, each holding one file loom also writes.
  for (const char* name : {"model.safetensors", "metrics.jsonl", "config.json"}) {
    const fs::path mine = f.dir / (std::string("mine_") + name);
    write_file(mine / name, "the user's");
    Result r = f.run(f.train_args(mine, 2));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "is not empty and is not a loom run")) << r.output;
    EXPECT_TRUE(contains(r.output, name)) << "the message names what is there: " << r.output;
    EXPECT_EQ(read_file(mine / name), "the user's");
    EXPECT_FALSE(fs::exists(mine / ".lock"));
  }

  // --overwrite replaces loom's run and leaves the user's file beside it.
  write_file(run / "notes.txt", "mine");
  Result over = f.run(f.train_args(run, 2, {"--overwrite"}));
  ASSERT_EQ(over.status, 0) << over.output;
  EXPECT_TRUE(contains(over.output, "--overwrite: deleted")) << over.output;
  EXPECT_EQ(read_file(run / "notes.txt"), "mine");
  EXPECT_NE(read_file(run / "metrics.jsonl"), metrics);
  EXPECT_EQ(state_of(run), "finished");

  Result both = f.run(f.train_args(run, 2, {"--overwrite", "--resume"}));
  EXPECT_EQ(both.status, 2) << "a usage error: " << both.output;
}

TEST(RunDirCli, ResumeWithoutAValidCheckpointChangesNothing) {
  Fixture f;
  const fs::path run = f.dir / "run";
  ASSERT_EQ(f.run(f.train_args(run, 4)).status, 0);
  const std::string model = read_file(run / "model.safetensors"), metrics = read_file(run / "metrics.jsonl");
  auto refs = loom::runs::list_checkpoints(run.string());
  ASSERT_EQ(refs.size(), 2u);  // 2 and 4
  for (const auto& c : refs) {  // damage every checkpoint
    std::fstream file(fs::path(c.path) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  Result r = f.run(f.train_args(run, 8, {"--resume"}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "skipping checkpoint")) << r.output;
  EXPECT_TRUE(contains(r.output, "has no valid checkpoint to resume from")) << r.output;
  EXPECT_FALSE(contains(r.output, "starting from step 0")) << r.output;
  EXPECT_EQ(read_file(run / "model.safetensors"), model);
  EXPECT_EQ(read_file(run / "metrics.jsonl"), metrics);
  EXPECT_EQ(loom::runs::list_checkpoints(run.string()).size(), 2u) << "the damaged checkpoints are still there";
  EXPECT_EQ(state_of(run), "finished");

  // --resume into a new directory starts a new run.
  Result fresh = f.run(f.train_args(f.dir / "new", 2, {"--resume"}));
  EXPECT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_TRUE(contains(fresh.output, "starting from step 0")) << fresh.output;
}

TEST(RunDirCli, RetentionLeavesAUsersCheckpointFolderAlone) {
  Fixture f;
  const fs::path run = f.dir / "run";
  ASSERT_EQ(f.run(f.train_args(run, 4, {"--set", "checkpoint.keep_last=1"})).status, 0);
  write_file(run / "checkpoints" / "step_00000001" / "notes.txt", "mine");
  Result r = f.run(f.train_args(run, 8, {"--resume", "--set", "checkpoint.keep_last=1"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_file(run / "checkpoints" / "step_00000001" / "notes.txt"), "mine");
  std::vector<int64_t> steps;
  for (const auto& c : loom::runs::list_checkpoints(run.string())) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 8}));
}

TEST(RunDirCli, ImportAndExportFollowTheSameRule) {
  Fixture f;
  const std::string hf = std::string(LOOM_SOURCE_DIR) + "/tests/models/llama/fixtures/hf_tiny";
  const fs::path imported = f.dir / "imported";
  Result first = f.run({"import", "--hf", hf, "--out", imported.string()});
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(imported / "run.json"))["kind"], "import");
  const std::string model = read_file(imported / "model.safetensors");
  Result again = f.run({"import", "--hf", hf, "--out", imported.string()});
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_TRUE(contains(again.output, "already holds a finished loom import")) << again.output;
  Result over = f.run({"import", "--hf", hf, "--out", imported.string(), "--overwrite"});
  EXPECT_EQ(over.status, 0) << over.output;
  EXPECT_EQ(read_file(imported / "model.safetensors"), model);

  // Into a training run, and into a directory of the user's: refused, untouched.
  const fs::path run = f.dir / "run";
  ASSERT_EQ(f.run(f.train_args(run, 2)).status, 0);
  const std::string run_model = read_file(run / "model.safetensors");
  Result into_run = f.run({"import", "--hf", hf, "--out", run.string()});
  EXPECT_EQ(into_run.status, 1) << into_run.output;
  EXPECT_EQ(read_file(run / "model.safetensors"), run_model);
  const fs::path mine = f.dir / "mine";
  write_file(mine / "config.json", "{\"mine\": true}");
  Result into_mine = f.run({"import", "--hf", hf, "--out", mine.string(), "--overwrite"});
  EXPECT_EQ(into_mine.status, 1) << into_mine.output;
  EXPECT_EQ(read_file(mine / "config.json"), "{\"mine\": true}");

  const fs::path exported = f.dir / "exported";
  Result ex = f.run({"export", "--run", run.string(), "--out", exported.string()});
  ASSERT_EQ(ex.status, 0) << ex.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(exported / "run.json"))["kind"], "export");
  Result ex_again = f.run({"export", "--run", run.string(), "--out", exported.string()});
  EXPECT_EQ(ex_again.status, 1) << ex_again.output;
  EXPECT_TRUE(contains(ex_again.output, "--overwrite")) << ex_again.output;
  Result ex_mine = f.run({"export", "--run", run.string(), "--out", mine.string()});
  EXPECT_EQ(ex_mine.status, 1) << ex_mine.output;
  EXPECT_EQ(read_file(mine / "config.json"), "{\"mine\": true}");
  EXPECT_TRUE(f.run({"export", "--run", run.string(), "--out", exported.string(), "--overwrite"}).status == 0);
}

TEST(RunDirCli, OneWriterPerRunAndKillNineLeavesNoStaleLock) {
  Fixture f;
  const fs::path run = f.dir / "run";
  Process first = spawn(f.train_args(run, 1000000, {"--set", "checkpoint.interval=3"}), f.log("first"));
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (loom::runs::list_checkpoints(run.string()).empty() && Clock::now() < give_up) {
    ASSERT_FALSE(first.wait_for(std::chrono::milliseconds(20))) << read_file(first.log);
  }
  ASSERT_FALSE(loom::runs::list_checkpoints(run.string()).empty()) << read_file(first.log);

  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--resume"}, std::vector<std::string>{},
                                                std::vector<std::string>{"--overwrite"}}) {
    const auto t0 = Clock::now();
    Result second = f.run(f.train_args(run, 10, extra));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(second.status, 1) << second.output;
    EXPECT_TRUE(contains(second.output, "run directory " + run.string() + " is in use by process " +
                                            std::to_string(first.pid)))
        << second.output;
    EXPECT_LT(seconds, 20.0) << "the second writer must fail at once, not wait";
  }
  Result importer = f.run({"import", "--hf", std::string(LOOM_SOURCE_DIR) + "/tests/models/llama/fixtures/hf_tiny",
                           "--out", run.string(), "--overwrite"});
  EXPECT_TRUE(contains(importer.output, "is in use by process " + std::to_string(first.pid))) << importer.output;
  EXPECT_FALSE(first.wait_for(std::chrono::milliseconds(1))) << "the first writer must be unaffected";

  ::kill(first.pid, SIGKILL);
  EXPECT_EQ(first.wait_for(std::chrono::seconds(30)), std::optional<int>(-1));
  // The kernel dropped the lock with the process: a resume takes it and finishes.
  const int64_t newest = loom::runs::latest_valid_checkpoint(run.string())->step;
  Result resumed = f.run(f.train_args(run, newest + 2, {"--resume"}));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resuming from step " + std::to_string(newest))) << resumed.output;
  EXPECT_EQ(state_of(run), "finished");
}

TEST(RunDirCli, CtrlCDuringAHugeStepStopsAtOnceAndSaysSo) {
  Fixture f;
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const fs::path run = f.dir / (sig == SIGINT ? "int" : "term");
    // One step is a million micro-batches: without the checks between them it would take hours.
    Process p = spawn(f.train_args(run, 5, {"--set", "training.grad_accum_steps=1000000", "--set", "logging.progress=lines"}),
                      f.log(run.filename()));
    ASSERT_TRUE(p.wait_for_output("training ", std::chrono::seconds(60))) << read_file(p.log);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into step 1
    ::kill(p.pid, sig);
    const auto t0 = Clock::now();
    std::optional<int> status = p.wait_for(std::chrono::seconds(30));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string log = read_file(p.log);
    ASSERT_TRUE(status) << "still running 30 s after the signal: " << log;
    EXPECT_EQ(*status, sig == SIGINT ? 130 : 143) << log;
    EXPECT_LT(seconds, 10.0) << log;
    EXPECT_TRUE(contains(log, "stopping after this step (step 1); press Ctrl-C again to abort")) << log;
    EXPECT_TRUE(contains(log, "step 1 abandoned after")) << log;
    EXPECT_TRUE(contains(log, "interrupted at step 0 of 5")) << log;
    EXPECT_FALSE(contains(log, "done:")) << log;
    EXPECT_EQ(state_of(run), "interrupted");
    EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000000" / "manifest.json")) << log;
  }
}

TEST(RunDirCli, ASecondCtrlCAbortsAtOnce) {
  Fixture f;
  const fs::path run = f.dir / "run";
  // Every checkpoint file waits 3 s (the crash test's hook), so a clean stop takes at least 12 s.
  Process p = spawn(f.train_args(run, 1000, {"--set", "checkpoint.interval=1"}), f.log("run"),
                    {{"LOOM_TEST_CHECKPOINT_PAUSE_MS", "3000"}});
  ASSERT_TRUE(p.wait_for_output("training ", std::chrono::seconds(60))) << read_file(p.log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(p.pid, SIGINT);
  ASSERT_TRUE(p.wait_for_output("press Ctrl-C again to abort", std::chrono::seconds(10))) << read_file(p.log);
  ::kill(p.pid, SIGINT);
  const auto t0 = Clock::now();
  std::optional<int> status = p.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status) << read_file(p.log);
  EXPECT_EQ(*status, 130) << read_file(p.log);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0) << read_file(p.log);
  EXPECT_TRUE(contains(read_file(p.log), "aborting")) << read_file(p.log);
  // The lock went with the process (the run, killed inside its first checkpoint, has none to resume).
  Result after = f.run(f.train_args(run, 2, {"--overwrite"}));
  EXPECT_EQ(after.status, 0) << after.output;
}

// A stop that lands while a checkpoint is written ends the run at the step it announced ("stopping after
// this step (step N)"), not one step later (issue 32).
TEST(RunDirCli, AStopDuringACheckpointEndsAtTheStepItAnnounced) {
  Fixture f;
  const fs::path run = f.dir / "run";
  // Every checkpoint file waits 400 ms: a step's checkpoint takes over a second, its compute milliseconds.
  Process p = spawn(f.train_args(run, 1000, {"--set", "checkpoint.interval=1", "--set", "eval.interval=0"}),
                    f.log("run"), {{"LOOM_TEST_CHECKPOINT_PAUSE_MS", "400"}});
  ASSERT_TRUE(p.wait_for_output("training ", std::chrono::seconds(60))) << read_file(p.log);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ::kill(p.pid, SIGTERM);
  std::optional<int> status = p.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(status) << read_file(p.log);
  const std::string log = read_file(p.log);
  EXPECT_EQ(*status, 143) << log;
  const std::string said = "stopping after this step (step ";
  const size_t at = log.find(said);
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t announced = std::stoll(log.substr(at + said.size()));
  EXPECT_EQ(nlohmann::json::parse(read_file(run / "run.json"))["step"], announced) << log;
}

TEST(RunDirCli, AStopInTheMiddleOfAnAccumulationResumesExactly) {
  Fixture f;
  const fs::path ref = f.dir / "ref", run = f.dir / "run";
  const std::vector<std::string> extra = {"--set", "training.grad_accum_steps=200", "--set", "checkpoint.interval=100",
                                          "--set", "eval.interval=0", "--set", "logging.progress=lines"};
  Result whole = f.run(f.train_args(ref, 6, extra));
  ASSERT_EQ(whole.status, 0) << whole.output;

  Process p = spawn(f.train_args(run, 6, extra), f.log("stopped"));
  ASSERT_TRUE(p.wait_for_output("training ", std::chrono::seconds(60))) << read_file(p.log);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ::kill(p.pid, SIGINT);
  std::optional<int> status = p.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(status) << read_file(p.log);
  if (*status == 0 && contains(read_file(p.log), "done: 6 steps")) GTEST_SKIP() << "the run finished before the signal";
  ASSERT_EQ(*status, 130) << read_file(p.log);
  if (!contains(read_file(p.log), "abandoned")) std::printf("[ note     ] the signal landed between steps\n");

  std::vector<std::string> resume = extra;
  resume.push_back("--resume");
  Result resumed = f.run(f.train_args(run, 6, resume));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(curve(ref), curve(run));
  EXPECT_EQ(read_file(ref / "model.safetensors"), read_file(run / "model.safetensors"));
}

TEST(RunDirCli, ExitStatusesAndMessages) {
  Fixture f;
  Result usage = f.run({"train", "--no-such-option"});
  EXPECT_EQ(usage.status, 2) << usage.output;
  Result missing = f.run({"eval"});  // --data is required
  EXPECT_EQ(missing.status, 2) << missing.output;
  Result user = f.run({"train", "--config", "tiny", "--set", "optimizer.lr=abc", "--out", (f.dir / "x").string()});
  EXPECT_EQ(user.status, 1) << user.output;
  EXPECT_TRUE(contains(user.output, "error: config: optimizer.lr")) << user.output;
  EXPECT_FALSE(fs::exists(f.dir / "x")) << "a config error creates nothing";
  Result version = f.run({"--version"});
  EXPECT_EQ(version.status, 0) << version.output;
  EXPECT_TRUE(contains(version.output, "loom 0.")) << version.output;

  // A run directory that cannot be created: a message naming the path, not a raw filesystem error.
  write_file(f.dir / "a_file", "x");
  Result fs_error = f.run(f.train_args(f.dir / "a_file" / "run", 2));
  EXPECT_EQ(fs_error.status, 1) << fs_error.output;
  EXPECT_TRUE(contains(fs_error.output, (f.dir / "a_file" / "run").string())) << fs_error.output;
  EXPECT_FALSE(contains(fs_error.output, "filesystem error")) << fs_error.output;
}

TEST(RunDirCli, EvalOfNonFiniteWeightsIsAnError) {
  Fixture f;
  const fs::path run = f.dir / "run";
  ASSERT_EQ(f.run(f.train_args(run, 2)).status, 0);
  const std::string weights = (run / "model.safetensors").string();
  {
    auto file = loom::io::SafetensorsFile::open(weights);
    auto metadata = file.metadata();
    std::map<std::string, loom::Tensor> tensors;
    for (const auto& name : file.names()) {
      loom::Tensor t = file.tensor(name).clone();
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::nanf("");
      tensors.emplace(name, t);
    }
    loom::io::write_safetensors(weights + ".nan", tensors, metadata);
  }
  fs::rename(weights + ".nan", weights);
  Result r = f.run({"eval", "--run", run.string(), "--data", (f.dir / "val.bin").string()});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "not finite")) << r.output;
  EXPECT_FALSE(contains(r.output, "\"loss\"")) << r.output;
  // Found when the weights are loaded, naming a tensor, before any window is read; and generate refuses
  // them rather than printing the same token over and over (issue 32).
  EXPECT_TRUE(contains(r.output, "tensor '")) << r.output;
  Result g = f.run({"generate", "--run", run.string(), "--prompt", "It is", "--max-new-tokens", "4"});
  EXPECT_EQ(g.status, 1) << g.output;
  EXPECT_TRUE(contains(g.output, "tensor '") && contains(g.output, "not finite")) << g.output;
}

TEST(RunDirCli, GenerateChecksItsOptionsBeforePrinting) {
  Fixture f;
  // A tokenizer whose ids fit a 300-token model, and a run trained with it.
  write_file(f.dir / "text.txt", "the quick brown fox jumps over the lazy dog. the dog sleeps.\n");
  ASSERT_EQ(f.run({"tokenizer", "train", "--input", (f.dir / "text.txt").string(), "--vocab-size", "270", "--out",
                   (f.dir / "tok.json").string()})
                .status,
            0);
  const fs::path run = f.dir / "run";
  Result trained = f.run(f.train_args(run, 2, {"--set", "model.vocab_size=300", "--set",
                                               "data.tokenizer=\"" + (f.dir / "tok.json").string() + "\""}));
  ASSERT_EQ(trained.status, 0) << trained.output;
  ASSERT_TRUE(fs::exists(run / "tokenizer.json"));
  Result ok = f.run({"generate", "--run", run.string(), "--prompt", "the dog", "--max-new-tokens", "3"});
  ASSERT_EQ(ok.status, 0) << ok.output;
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--temperature", "-1"},
                                              std::vector<std::string>{"--top-p", "0"},
                                              std::vector<std::string>{"--max-new-tokens", "-5"}}) {
    std::vector<std::string> args = {"generate", "--run", run.string(), "--prompt", "the dog"};
    args.insert(args.end(), bad.begin(), bad.end());
    Result r = f.run(args);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(r.stdout_only, "") << "nothing may be printed before the options are checked";
    EXPECT_TRUE(contains(r.output, "error: generate: ")) << r.output;
  }
}
