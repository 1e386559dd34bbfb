#include "io/outputs.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json.h"

namespace loom::io {
namespace fs = std::filesystem;

namespace {
// The path made absolute and resolved where it exists; the path as given when even that fails (a name
// too long, a component that is a file): the caller's own checks report those.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::path(path).lexically_normal() : p;
}

// `inner` is `outer` or lies below it.
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty() && std::next(o) == outer.end()) break;  // a trailing "/"
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// DIR/run.json is loom's run marker ({"format": "loom-run", ...}, runs/run_dir.h).
bool holds_run_marker(const fs::path& dir) {
  std::error_code ec;
  const fs::path marker = dir / "run.json";
  if (!fs::is_regular_file(marker, ec) || fs::file_size(marker, ec) > (1 << 20)) return false;
  std::ifstream in(marker);
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, false);
  return json.is_object() && json.value("format", "") == "loom-run";
}
}  // namespace

std::optional<std::string> enclosing_run(const std::string& path) {
  if (path.empty()) return std::nullopt;
  for (fs::path p = resolved(path); !p.empty(); p = p.parent_path()) {
    if (holds_run_marker(p)) return p.string();
    if (p == p.parent_path()) break;
  }
  return std::nullopt;
}

void check_output_apart(const std::string& what, const std::string& out, const std::string& in_what,
                        const std::string& in, bool replaces) {
  if (out.empty() || in.empty()) return;
  const fs::path o = resolved(out), i = resolved(in);
  if (o == i) {
    LOOM_FAIL(what, " ", brief_text(out, 200), " is the same path as ", in_what, " ", brief_text(in, 200),
              ": a command never writes over its own input; choose another output");
  }
  if (within(o, i)) {
    LOOM_FAIL(what, " ", brief_text(out, 200), " is inside ", in_what, " ", brief_text(in, 200),
              ": a command never writes into its own input; choose an output outside it");
  }
  if (replaces && within(i, o)) {
    LOOM_FAIL(what, " ", brief_text(out, 200), " holds ", in_what, " ", brief_text(in, 200),
              ": writing (or replacing) it could delete the input; choose another output");
  }
}

void check_output_outside_runs(const std::string& what, const std::string& out, const std::string& own_run) {
  const std::optional<std::string> run = enclosing_run(out);
  if (!run) return;
  if (!own_run.empty() && resolved(own_run) == resolved(out)) return;
  const bool same = resolved(out) == fs::path(*run);
  LOOM_FAIL(what, " ", brief_text(out, 200), same ? " is" : " is inside", " the loom run directory ", *run,
            " (it holds run.json), which belongs to the command that wrote it: choose an output outside it");
}

void check_output_file_new(const std::string& what, const std::string& out) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (ec || !fs::exists(st) || fs::is_directory(st)) return;
  LOOM_FAIL(what, " ", brief_text(out, 200), " exists; loom does not replace a file it was not asked to write "
            "(it may be yours, or another command's input): choose a new path, or move the file away first");
}

}  // namespace loom::io
