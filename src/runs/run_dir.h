// Run directories are owned: loom never overwrites or deletes what it did not write, never silently
// replaces one of its own runs, and lets one process at a time write into a run directory.
//
//   DIR/run.json  the ownership marker, written when loom starts writing into DIR (RunDir::start) and
//                 updated when it stops (RunDir::finish):
//                   {"format": "loom-run", "version": 1, "kind": "train" | "import" | "export",
//                    "state": "running" | "finished" | "interrupted" | "failed", "step": N (training),
//                    "created": "2024-05-01T10:00:00Z", "updated": ..., "loom_version": "0.1.0",
//                    "pid": N, "host": "..."}
//   DIR/.lock     an advisory flock(2), taken by RunDir::claim and held until the RunDir is destroyed (in
//                 the CLI: for the whole process). It holds "<pid> <host>" of the holder, for the message
//                 a second writer gets. The kernel drops the lock when the process ends, however it ends
//                 (kill -9 included), so a lock is never stale; a run.json that still says "running" while
//                 its lock is free belongs to a process that died.
//
// What RunDir::claim accepts (everything else is refused with a message that says what is there and what
// to do; nothing in DIR is touched by a refusal):
//   * a path that does not exist (created), or an empty directory: any command;
//   * loom's own run (DIR/run.json is loom's marker): with ExistingRun::Resume (training runs only: the
//     run continues from its newest valid checkpoint) or ExistingRun::Overwrite (start() first deletes what
//     loom wrote there: the run's files by name and the checkpoints whose manifest is loom's; anything else
//     in the directory stays);
//   * a training run written by a loom from before run.json (it has checkpoints with loom's manifest): with
//     Resume or Overwrite, as above;
//   * any other non-empty directory: never (it is the user's; loom does not delete files it did not write).
// A directory whose lock another process holds is refused at once: "run directory X is in use by process N".
//
// Tested in tests/runs/run_dir_test.cpp (the rules, the lock, in process) and tests/runs/
// run_dir_cli_test.cpp (train, resume, import and export through the real CLI, two concurrent writers,
// kill -9); the promises are listed in docs/guarantees.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::runs {

enum class RunKind { Train, Import, Export };
enum class RunState { Running, Finished, Interrupted, Failed };
// What to do when the directory already holds one of loom's runs.
enum class ExistingRun { Refuse, Resume, Overwrite };

const char* run_kind_name(RunKind kind);    // "train", "import", "export"
const char* run_state_name(RunState state);  // "running", "finished", "interrupted", "failed"

// DIR/run.json, parsed.
struct RunMarker {
  RunKind kind = RunKind::Train;
  RunState state = RunState::Running;
  std::optional<int64_t> step;  // the step a training run reached (set by finish)
  std::string created, updated, loom_version, host;
  int64_t pid = 0;

  nlohmann::ordered_json to_json() const;  // in the order above
};

// The marker of `dir`: nullopt when there is no run.json; throws loom::Error when run.json is there but
// is not loom's marker (then the directory is not a loom run).
std::optional<RunMarker> read_run_marker(const std::string& dir);

class RunDir {
 public:
  // Checks that loom may write into `dir` for `kind` (the rules above), creates it when it does not
  // exist, and takes its lock. Throws loom::Error naming the directory, what it holds and what to do.
  static RunDir claim(const std::string& dir, RunKind kind, ExistingRun existing = ExistingRun::Refuse);

  RunDir(RunDir&& other) noexcept;
  RunDir& operator=(RunDir&&) = delete;
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  // Releases the lock. A run that was started and not finished is marked "failed" (an exception is
  // unwinding the command); a directory that claim() created and nothing was started in is removed again.
  ~RunDir();

  const std::string& path() const { return path_; }
  // Nothing was in the directory when it was claimed (new, or nothing but loom's .lock / run.json).
  bool was_empty() const { return was_empty_; }
  // The run that was there when claimed (Resume, Overwrite), if it had a marker.
  const std::optional<RunMarker>& previous() const { return previous_; }

  // For --resume that found no valid checkpoint: starting from step 0 is only right when there was
  // nothing to continue. Throws (naming what the directory holds) unless was_empty().
  void check_nothing_to_resume() const;

  // Begins writing: with Overwrite, deletes the previous run's files first and returns their names
  // (relative to the directory); writes run.json with state "running" (a resumed run keeps its
  // "created" time).
  std::vector<std::string> start();
  // Records how the run ended (and, for training, the step it reached) in run.json.
  void finish(RunState state, std::optional<int64_t> step = std::nullopt);

 private:
  RunDir() = default;
  void write_marker();

  std::string path_;
  RunKind kind_ = RunKind::Train;
  ExistingRun existing_ = ExistingRun::Refuse;
  int lock_fd_ = -1;
  bool was_empty_ = false;
  bool created_ = false;  // claim() made the directory
  bool lock_created_ = false;  // claim() made DIR/.lock (a copied run has none): removed on a refusal
  bool started_ = false;
  std::optional<RunMarker> previous_;
  RunMarker marker_;
};

}  // namespace loom::runs
