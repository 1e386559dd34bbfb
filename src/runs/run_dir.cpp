#include "runs/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/version.h"
#include "io/file.h"
#include "io/json.h"
#include "io/outputs.h"
#include "runs/checkpoint.h"

namespace loom::runs {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMarker = "run.json";
constexpr const char* kLock = ".lock";

// The files loom writes at the top of a run directory, by any command: train (config.json, metrics.jsonl
// and its rewrite's temporary, model.safetensors, tokenizer.json), plot (loss.svg, lr.svg), import
// (model.safetensors, tokenizer.json), export (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json). --overwrite deletes these and the checkpoints loom wrote.
const std::set<std::string>& run_file_names() {
  static const std::set<std::string> names = {"config.json",       "metrics.jsonl",          "metrics.jsonl.tmp",
                                              "model.safetensors", "tokenizer.json",         "tokenizer_config.json",
                                              "generation_config.json", "loss.svg",          "lr.svg"};
  return names;
}

// io::write_file_atomically's temporary for `name`: ".<name>.tmp.<digits>".
bool is_temporary_of(const std::string& entry, const std::string& name) {
  const std::string prefix = "." + name + ".tmp.";
  return entry.size() > prefix.size() && entry.compare(0, prefix.size(), prefix) == 0 &&
         std::all_of(entry.begin() + static_cast<std::ptrdiff_t>(prefix.size()), entry.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// A .lock file as RunDir writes it: empty, or "<pid> <host>\n".
bool is_our_lock_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(path, ec))) return false;
  const auto size = fs::file_size(path, ec);
  if (ec || size > 300) return false;
  if (size == 0) return true;
  auto mapped = io::MappedFile::open(path.string());
  const std::string text(reinterpret_cast<const char*>(mapped->data()), mapped->size());
  const size_t space = text.find(' ');
  return space != std::string::npos && space > 0 &&
         std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(space),
                     [](char c) { return c >= '0' && c <= '9'; }) &&
         text.back() == '\n' && text.find('\n') == text.size() - 1;
}

// The directory's entries other than loom's bookkeeping (its .lock; run.json when it is loom's marker),
// sorted, directories with a trailing '/'.
std::vector<std::string> contents_of(const fs::path& dir, bool marker_is_ours) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name == kLock && is_our_lock_file(entry.path())) continue;
    if (marker_is_ours && (name == kMarker || is_temporary_of(name, kMarker))) continue;
    std::error_code ec;
    if (fs::is_directory(entry.symlink_status(ec))) name += "/";
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "config.json, metrics.jsonl, checkpoints/ and 4 more".
std::string list_some(const std::vector<std::string>& names, size_t shown = 6) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += str(" and ", names.size() - shown, " more");
  return out;
}

bool has_loom_checkpoints(const std::string& dir) {
  for (const CheckpointRef& c : list_checkpoints(dir)) {
    if (checkpoint_written_by_loom(c.path)) return true;
  }
  return false;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

const char* kind_phrase(RunKind kind) {
  switch (kind) {
    case RunKind::Train: return "training run";
    case RunKind::Import: return "import (loom import)";
    case RunKind::Export: return "export (loom export)";
  }
  return "run";
}

// "a finished loom training run (step 200; created 2024-05-01T10:00:00Z by loom 0.1.0, process 123 on h)".
std::string describe(const RunMarker& m, bool process_died) {
  std::string state = run_state_name(m.state);
  if (process_died) state = "unfinished";
  std::string s = str(state == "interrupted" || state == "unfinished" ? "an " : "a ", state, " loom ",
                      kind_phrase(m.kind), " (");
  if (m.step) s += str("step ", *m.step, "; ");
  s += str("created ", m.created, " by loom ", m.loom_version, ", process ", m.pid, " on ", m.host, ")");
  if (process_died) s += str(" whose process ended without closing it (killed or crashed)");
  return s;
}

RunKind kind_from_name(const std::string& name, const std::string& source) {
  for (RunKind k : {RunKind::Train, RunKind::Import, RunKind::Export}) {
    if (name == run_kind_name(k)) return k;
  }
  LOOM_FAIL(source, ": unknown \"kind\" \"", name, "\" (loom writes train, import or export)");
}

RunState state_from_name(const std::string& name, const std::string& source) {
  for (RunState s : {RunState::Running, RunState::Finished, RunState::Interrupted, RunState::Failed}) {
    if (name == run_state_name(s)) return s;
  }
  LOOM_FAIL(source, ": unknown \"state\" \"", name, "\" (running, finished, interrupted or failed)");
}

// Who holds the lock, from the lock file's "<pid> <host>".
std::string lock_holder(int fd) {
  char buf[300] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return "another process";
  const size_t space = text.find(' ');
  if (space == std::string::npos) return "process " + text;
  const std::string pid = text.substr(0, space), host = text.substr(space + 1);
  return host == host_name() ? "process " + pid : str("process ", pid, " on host ", host);
}

// What a directory holds, for claim(): loom's marker, if any, and every other entry.
struct Inspection {
  std::optional<RunMarker> marker;
  std::vector<std::string> contents;  // contents_of()
};

// Refuses a non-empty directory that is not loom's (no marker, or a run.json that is not loom's); a
// training run from before run.json (loom's checkpoints, no marker) passes with Resume or Overwrite.
Inspection inspect_or_refuse(const std::string& dir, ExistingRun existing, const std::string& cmd) {
  Inspection seen;
  std::string not_ours;
  try {
    seen.marker = read_run_marker(dir);
  } catch (const Error& e) {
    not_ours = e.what();
  }
  seen.contents = contents_of(dir, not_ours.empty());
  if (seen.marker || seen.contents.empty()) return seen;
  if (has_loom_checkpoints(dir)) {
    LOOM_CHECK(existing != ExistingRun::Refuse, cmd, ": ", dir, " already holds a loom training run (",
               list_some(seen.contents), "): continue it with --resume, replace it with --overwrite, or choose "
               "another --out");
    return seen;
  }
  LOOM_FAIL(cmd, ": ", dir, " is not empty and is not a loom run (",
            not_ours.empty() ? std::string("no run.json") : not_ours, "); it holds ", list_some(seen.contents),
            ". loom writes only into a new or empty directory or into one of its own runs, and never deletes files "
            "it did not write: choose another --out, or move these files away");
}

}  // namespace

const char* run_kind_name(RunKind kind) {
  switch (kind) {
    case RunKind::Train: return "train";
    case RunKind::Import: return "import";
    case RunKind::Export: return "export";
  }
  return "?";
}

const char* run_state_name(RunState state) {
  switch (state) {
    case RunState::Running: return "running";
    case RunState::Finished: return "finished";
    case RunState::Interrupted: return "interrupted";
    case RunState::Failed: return "failed";
  }
  return "?";
}

nlohmann::ordered_json RunMarker::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "loom-run";
  j["version"] = 1;
  j["kind"] = run_kind_name(kind);
  j["state"] = run_state_name(state);
  if (step) j["step"] = *step;
  j["created"] = created;
  j["updated"] = updated;
  j["loom_version"] = loom_version;
  j["pid"] = pid;
  j["host"] = host;
  return j;
}

std::optional<RunMarker> read_run_marker(const std::string& dir) {
  const fs::path path = fs::path(dir) / kMarker;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const std::string source = path.string();
  LOOM_CHECK(fs::is_regular_file(fs::symlink_status(path, ec)), source, " is not a regular file, so not loom's run marker");
  auto mapped = io::MappedFile::open(source);
  json j = io::try_parse_json(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()));
  LOOM_CHECK(!j.is_discarded() && j.is_object() && j.value("format", "") == "loom-run", source,
             " is not loom's run marker (no \"format\": \"loom-run\")");
  try {
    RunMarker m;
    m.kind = kind_from_name(j.at("kind").get<std::string>(), source);
    m.state = state_from_name(j.at("state").get<std::string>(), source);
    if (j.contains("step") && j["step"].is_number_integer()) m.step = j["step"].get<int64_t>();
    m.created = j.value("created", "");
    m.updated = j.value("updated", "");
    m.loom_version = j.value("loom_version", "");
    m.host = j.value("host", "");
    m.pid = j.value("pid", int64_t{0});
    return m;
  } catch (const json::exception& e) {
    LOOM_FAIL(source, ": malformed run marker: ", e.what());
  }
}

RunDir RunDir::claim(const std::string& dir, RunKind kind, ExistingRun existing) {
  LOOM_ASSERT(kind == RunKind::Train || existing != ExistingRun::Resume, "only training runs resume");
  const std::string cmd = str(run_kind_name(kind), existing == ExistingRun::Resume ? " --resume" : "");
  LOOM_CHECK(!dir.empty(), cmd, ": the output directory is empty (give --out DIR)");
  const fs::path path(dir);
  std::error_code ec;
  // A run is never written inside another one (io/outputs.h): runs/t/hf would sit among runs/t's files.
  if (const auto enclosing = io::enclosing_run((fs::absolute(path, ec) / "..").lexically_normal().string())) {
    LOOM_FAIL(cmd, ": ", dir, " is inside the loom run directory ", *enclosing,
              " (it holds run.json), which belongs to the command that wrote it: choose an --out outside it");
  }
  const fs::file_status status = fs::status(path, ec);
  if (fs::exists(status)) {
    LOOM_CHECK(fs::is_directory(status), cmd, ": ", dir,
               " exists and is not a directory; loom writes a run into a directory: choose another --out");
  } else {
    fs::create_directories(path, ec);
    LOOM_CHECK(!ec, cmd, ": cannot create the directory ", dir, ": ", ec.message());
  }
  const bool created = !fs::exists(status);

  // Before the lock is taken (which creates DIR/.lock): refuse a directory that is not loom's without
  // leaving anything in it.
  Inspection seen = inspect_or_refuse(dir, existing, cmd);

  RunDir run;
  run.path_ = dir;
  run.kind_ = kind;
  run.existing_ = existing;
  run.created_ = created;
  const std::string lock_path = (path / kLock).string();
  run.lock_created_ = !fs::exists(fs::symlink_status(lock_path, ec));
  run.lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(run.lock_fd_ >= 0, cmd, ": cannot write in the directory ", dir, " (creating ", lock_path, ": ",
             std::strerror(errno), ")");
  if (::flock(run.lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    LOOM_CHECK(err != EWOULDBLOCK, "run directory ", dir, " is in use by ", lock_holder(run.lock_fd_),
               " (it holds ", lock_path, "); wait for it to finish or stop it, or choose another --out");
    LOOM_FAIL(cmd, ": cannot lock ", lock_path, ": ", std::strerror(err));
  }
  // Under the lock, again: another process may have written a run here since the first look. A refusal
  // leaves .lock as it was (the holder is written only once the directory is ours).
  seen = inspect_or_refuse(dir, existing, cmd);
  const std::optional<RunMarker>& marker = seen.marker;
  run.was_empty_ = seen.contents.empty();
  run.previous_ = marker;
  if (!run.was_empty_) {
    // A pre-run.json directory with loom's checkpoints is a training run.
    const RunKind there = marker ? marker->kind : RunKind::Train;
    // A "running" marker whose lock we now hold: its process died.
    const bool died = marker && marker->state == RunState::Running;
    const std::string what = marker ? describe(*marker, died) : "a loom training run";
    switch (existing) {
      case ExistingRun::Refuse:
        if (kind == RunKind::Train && there == RunKind::Train) {  // only training continues a run
          LOOM_FAIL(cmd, ": ", dir, " already holds ", what,
                    ": continue it with --resume, replace it with --overwrite, or choose another --out");
        }
        LOOM_FAIL(cmd, ": ", dir, " already holds ", what,
                  there == kind ? ": replace it with --overwrite, or choose another --out"
                                : str(", which loom ", run_kind_name(kind), " does not replace: choose another --out"));
      case ExistingRun::Resume:
        LOOM_CHECK(there == RunKind::Train, cmd, ": ", dir, " holds ", what,
                   ", not a training run: there is nothing to resume; choose another --out");
        break;
      case ExistingRun::Overwrite:
        // The one rule for writers (runs/outputs.h): --overwrite replaces only the writer's own kind of output;
        // an export never deletes a training run's checkpoints, an import never a training run's history.
        LOOM_CHECK(there == kind, cmd, " --overwrite: ", dir, " holds ", what, "; --overwrite replaces only what loom ",
                   run_kind_name(kind), " wrote, so nothing was changed: choose another --out");
        break;
    }
  }
  const std::string holder = str(::getpid(), " ", host_name(), "\n");
  if (::ftruncate(run.lock_fd_, 0) != 0 ||
      ::pwrite(run.lock_fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    LOOM_FAIL(cmd, ": cannot write ", lock_path, ": ", std::strerror(errno));
  }
  return run;
}

RunDir::RunDir(RunDir&& other) noexcept
    : path_(std::move(other.path_)),
      kind_(other.kind_),
      existing_(other.existing_),
      lock_fd_(other.lock_fd_),
      was_empty_(other.was_empty_),
      created_(other.created_),
      lock_created_(other.lock_created_),
      started_(other.started_),
      previous_(std::move(other.previous_)),
      marker_(std::move(other.marker_)) {
  other.lock_fd_ = -1;
  other.created_ = false;
  other.started_ = false;
}

RunDir::~RunDir() {
  if (started_ && marker_.state == RunState::Running) {
    try {
      marker_.state = RunState::Failed;
      write_marker();
    } catch (...) {  // best effort: the exception that is unwinding says what went wrong
    }
  }
  if (created_ && !started_ && lock_fd_ >= 0) {  // the command failed before writing anything: leave no trace
    std::error_code ec;
    fs::remove(fs::path(path_) / kLock, ec);
    fs::remove(path_, ec);  // only if empty
  }
  if (!created_ && lock_created_ && !started_ && lock_fd_ >= 0) {  // a refused claim of a run that had no .lock
    std::error_code ec;
    fs::remove(fs::path(path_) / kLock, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void RunDir::check_nothing_to_resume() const {
  if (was_empty_) return;
  const fs::path dir(path_);
  std::vector<std::string> contents = contents_of(dir, true);
  std::string what = previous_ ? describe(*previous_, previous_->state == RunState::Running) : "a loom training run";
  LOOM_FAIL("train --resume: ", path_, " has no valid checkpoint to resume from, but it is not empty: it holds ", what,
            " (", list_some(contents), "). Starting again from step 0 would replace it, so nothing was changed: "
            "to start over in this directory use --overwrite instead of --resume, or choose another --out");
}

std::vector<std::string> RunDir::start() {
  LOOM_ASSERT(lock_fd_ >= 0 && !started_, "RunDir::start on a directory that is not claimed, or twice");
  std::vector<std::string> removed;
  if (existing_ == ExistingRun::Overwrite && !was_empty_) {
    const fs::path dir(path_);
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      std::error_code ec;
      if (!fs::is_regular_file(entry.symlink_status(ec))) continue;
      const bool ours = run_file_names().count(name) > 0 ||
                        std::any_of(run_file_names().begin(), run_file_names().end(),
                                    [&](const std::string& n) { return is_temporary_of(name, n); });
      if (!ours) continue;
      fs::remove(entry.path());
      removed.push_back(name);
    }
    for (std::string& c : delete_checkpoints(path_)) removed.push_back(std::move(c));
    std::sort(removed.begin(), removed.end());
    if (!removed.empty()) io::fsync_path(path_);
  }
  marker_ = RunMarker{};
  marker_.kind = kind_;
  marker_.state = RunState::Running;
  marker_.created = existing_ == ExistingRun::Resume && previous_ ? previous_->created : now_utc();
  if (existing_ == ExistingRun::Resume && previous_) marker_.step = previous_->step;
  marker_.loom_version = kVersion;
  marker_.pid = ::getpid();
  marker_.host = host_name();
  write_marker();
  started_ = true;
  return removed;
}

void RunDir::finish(RunState state, std::optional<int64_t> step) {
  LOOM_ASSERT(started_, "RunDir::finish before start");
  marker_.state = state;
  if (step) marker_.step = step;
  write_marker();
}

void RunDir::write_marker() {
  marker_.updated = now_utc();
  const std::string text = marker_.to_json().dump(2) + "\n";
  io::write_file_atomically((fs::path(path_) / kMarker).string(),
                            [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

}  // namespace loom::runs
