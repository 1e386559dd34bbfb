#include "runs/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "tokenizer/sha256.h"

namespace loom::runs {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kTrashPrefix = ".trash-";

// step_<digits> -> the number; anything else (temporaries, stray files) -> nullopt.
std::optional<int64_t> step_of_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

struct FileDigest {
  uint64_t bytes = 0;
  std::string sha256;
};

FileDigest digest(const std::string& path) {
  auto mapped = io::MappedFile::open(path);
  tokenizer::Sha256 h;
  if (mapped->size() > 0) h.update(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()));
  return {mapped->size(), h.hex_digest()};
}

void write_text_durably(const std::string& path, const std::string& text) {
  io::write_file_atomically(path, [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The names loom gives a checkpoint's files (Trainer::save_checkpoint), and their temporaries while
// io::write_file_atomically writes them (".<name>.tmp.<n>"): all that a crashed writer can leave.
bool is_loom_checkpoint_file_name(const std::string& name) {
  static const std::set<std::string> known = {"model.safetensors", "optimizer.safetensors", "trainer_state.json",
                                              kManifest};
  if (known.count(name)) return true;
  const size_t tmp = name.rfind(".tmp.");
  return name.size() > 1 && name[0] == '.' && tmp != std::string::npos && known.count(name.substr(1, tmp - 1)) &&
         all_digits(std::string_view(name).substr(tmp + 5));
}

// A leftover of a crashed writer or deleter that loom may remove: named .tmp-step_<N>-<pid> or
// .trash-step_<N>-<pid>, and holding nothing but a checkpoint loom wrote or files loom writes there.
bool is_loom_leftover(const fs::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  std::string_view rest;
  for (const char* prefix : {kTmpPrefix, kTrashPrefix}) {
    if (name.rfind(prefix, 0) == 0) rest = std::string_view(name).substr(std::string_view(prefix).size());
  }
  const size_t dash = rest.rfind('-');
  if (dash == std::string_view::npos || !step_of_name(std::string(rest.substr(0, dash))) ||
      !all_digits(rest.substr(dash + 1))) {
    return false;
  }
  std::error_code ec;
  if (!fs::is_directory(entry.symlink_status(ec))) return false;
  if (checkpoint_written_by_loom(entry.path().string())) return true;
  for (const auto& e : fs::directory_iterator(entry.path(), ec)) {
    if (!fs::is_regular_file(e.symlink_status(ec)) || !is_loom_checkpoint_file_name(e.path().filename().string())) {
      return false;
    }
  }
  return !ec;
}

// Renames a step directory away (so its name never points at a half-deleted directory), then deletes it.
void delete_step_dir(const fs::path& root, const CheckpointRef& c) {
  const fs::path trash = root / str(kTrashPrefix, checkpoint_name(c.step), "-", ::getpid());
  fs::remove_all(trash);
  fs::rename(c.path, trash);
  fs::remove_all(trash);
}

}  // namespace

bool checkpoint_written_by_loom(const std::string& dir) {
  try {
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
    const fs::path manifest_path = fs::path(dir) / kManifest;
    if (!fs::is_regular_file(fs::symlink_status(manifest_path, ec))) return false;
    auto mapped = io::MappedFile::open(manifest_path.string());
    json m = io::try_parse_json(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()));
    if (m.is_discarded() || !m.is_object() || m.value("format", "") != "loom-checkpoint" || !m.contains("files") ||
        !m["files"].is_object()) {
      return false;
    }
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!fs::is_regular_file(entry.symlink_status())) return false;
      if (name != kManifest && !m["files"].contains(name)) return false;  // a file loom did not put there
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string checkpoints_dir(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::vector<CheckpointRef> list_checkpoints(const std::string& run_dir) {
  std::vector<CheckpointRef> out;
  const fs::path dir = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    auto step = step_of_name(entry.path().filename().string());
    if (step && entry.is_directory()) out.push_back({*step, entry.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return out;
}

std::optional<std::string> checkpoint_problem(const std::string& dir) {
  try {
    const fs::path manifest_path = fs::path(dir) / kManifest;
    if (!fs::exists(manifest_path)) return str("no ", kManifest, " (the checkpoint was not finished)");
    auto mapped = io::MappedFile::open(manifest_path.string());
    json m = io::try_parse_json(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()));
    if (m.is_discarded() || !m.is_object()) return str(kManifest, " is not valid JSON");
    if (!m.contains("step") || !m["step"].is_number_integer()) return str(kManifest, " has no integer \"step\"");
    auto named = step_of_name(fs::path(dir).filename().string());
    if (named && *named != m["step"].get<int64_t>()) {
      return str(kManifest, " says step ", m["step"].get<int64_t>(), " but the directory is step ", *named);
    }
    if (!m.contains("files") || !m["files"].is_object() || m["files"].empty()) {
      return str(kManifest, " lists no files");
    }
    for (const auto& [name, want] : m["files"].items()) {
      const fs::path p = fs::path(dir) / name;
      if (!fs::exists(p)) return str(name, " is missing");
      FileDigest got = digest(p.string());
      const uint64_t bytes = want.value("bytes", uint64_t{0});
      if (got.bytes != bytes) return str(name, " has ", got.bytes, " bytes, the manifest says ", bytes);
      if (got.sha256 != want.value("sha256", "")) return str(name, " does not match its sha256 in the manifest");
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return str("cannot be read: ", e.what());
  }
}

std::optional<CheckpointRef> latest_valid_checkpoint(
    const std::string& run_dir, const std::function<void(const std::string&, const std::string&)>& skipped) {
  auto all = list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto problem = checkpoint_problem(it->path);
    if (!problem) return *it;
    if (skipped) skipped(it->path, *problem);
  }
  return std::nullopt;
}

std::string write_checkpoint(const std::string& run_dir, int64_t step, const std::vector<CheckpointFile>& files,
                             const std::function<void(const std::string&)>& before_file) {
  const fs::path root = checkpoints_dir(run_dir);
  const fs::path final_dir = root / checkpoint_name(step);
  fs::create_directories(root);
  if (fs::exists(final_dir)) {
    auto problem = checkpoint_problem(final_dir.string());
    if (!problem) return final_dir.string();  // already saved, and intact
    LOOM_CHECK(checkpoint_written_by_loom(final_dir.string()), "checkpoint: cannot save step ", step, ": ",
               final_dir.string(), " is there already and was not written by loom (", *problem,
               "); loom does not replace files it did not write: move it out of ", root.string());
    // A damaged checkpoint of the same step, written by loom: replace it.
    delete_step_dir(root, {step, final_dir.string()});
  }
  const fs::path tmp = root / str(kTmpPrefix, checkpoint_name(step), "-", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  json manifest = {{"format", "loom-checkpoint"}, {"version", 1}, {"step", step}, {"files", json::object()}};
  for (const CheckpointFile& f : files) {
    if (before_file) before_file(f.name);
    const std::string path = (tmp / f.name).string();
    f.write(path);  // durable on return (each writer fsyncs its file)
    FileDigest d = digest(path);
    manifest["files"][f.name] = {{"bytes", d.bytes}, {"sha256", d.sha256}};
  }
  if (before_file) before_file(kManifest);
  write_text_durably((tmp / kManifest).string(), manifest.dump(2) + "\n");
  io::fsync_path(tmp.string());
  fs::rename(tmp, final_dir);  // the commit point
  io::fsync_path(root.string());
  return final_dir.string();
}

std::vector<int64_t> apply_retention(const std::string& run_dir, int64_t keep_last,
                                     const std::vector<int64_t>& also_keep, std::optional<int64_t> known_valid) {
  const fs::path root = checkpoints_dir(run_dir);
  std::vector<int64_t> deleted;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return deleted;
  // Leftovers of crashed writers or deleters.
  for (const auto& entry : fs::directory_iterator(root)) {
    if (is_loom_leftover(entry)) fs::remove_all(entry.path());
  }
  if (keep_last <= 0) return deleted;
  std::vector<CheckpointRef> all;  // the ones loom wrote; any other step_<N> folder is not ours to count or delete
  for (CheckpointRef& c : list_checkpoints(run_dir)) {
    if (checkpoint_written_by_loom(c.path)) all.push_back(std::move(c));
  }
  std::set<int64_t> keep(also_keep.begin(), also_keep.end());
  for (size_t i = all.size() > static_cast<size_t>(keep_last) ? all.size() - static_cast<size_t>(keep_last) : 0;
       i < all.size(); ++i) {
    keep.insert(all[i].step);
  }
  // The newest valid checkpoint survives whatever else is kept: newer damaged ones must not push it out.
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step == known_valid || !checkpoint_problem(it->path)) {
      keep.insert(it->step);
      break;
    }
  }
  for (const CheckpointRef& c : all) {
    if (keep.count(c.step)) continue;
    delete_step_dir(root, c);
    deleted.push_back(c.step);
  }
  if (!deleted.empty()) io::fsync_path(root.string());
  return deleted;
}

std::vector<std::string> delete_checkpoints(const std::string& run_dir) {
  const fs::path root = checkpoints_dir(run_dir);
  std::vector<std::string> deleted;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(root, ec))) return deleted;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!is_loom_leftover(entry)) continue;
    fs::remove_all(entry.path());
    deleted.push_back((fs::path("checkpoints") / entry.path().filename()).string());
  }
  for (const CheckpointRef& c : list_checkpoints(run_dir)) {
    if (!checkpoint_written_by_loom(c.path)) continue;
    delete_step_dir(root, c);
    deleted.push_back((fs::path("checkpoints") / fs::path(c.path).filename()).string());
  }
  if (fs::is_empty(root, ec)) {
    fs::remove(root, ec);
    io::fsync_path(run_dir);
  } else if (!deleted.empty()) {
    io::fsync_path(root.string());
  }
  return deleted;
}

}  // namespace loom::runs
