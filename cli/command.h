// The `loom` CLI is a set of subcommands, each registered from its own cli/<name>.cpp file:
//
//   static loom::cli::Register reg("tokenizer", "Train, encode and decode byte-level BPE",
//                                  [](CLI::App& cmd) { ...add options and subcommands... });
//
// The setup function adds options and a callback; the callback calls the library (cli/ stays thin).
// main.cpp catches loom::Error, prints "error: <message>" and exits 1.
//
// An option that names a file or a directory says so where it is defined, with what the path holds:
//
//   loom::cli::in_dir(cmd.add_option("--run", a.run, "run directory"), "run");
//   loom::cli::out_file(cmd.add_option("--logits-out", a.logits_out, "..."), "logits");
//
// The tag shows in --help (`--run DIR`), and `loom options --json` (cli/options.cpp) reports it, so that
// the wrong-way harness (tools/wrong_way.py) points every path option at the wrong things: a missing path,
// a directory where a file is read, another command's output, the run's own directory, a read-only one.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace loom::cli {

struct Command {
  std::string name;
  std::string description;
  std::function<void(CLI::App&)> setup;
};

std::vector<Command>& registry();

struct Register {
  Register(std::string name, std::string description, std::function<void(CLI::App&)> setup) {
    registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

// What a path option names: a file, a directory or either, that the command reads (In) or writes (Out).
enum class PathRole { InFile, InDir, InPath, OutFile, OutDir, OutPath };
const char* path_role_name(PathRole role);  // "in-file", "in-dir", "in-path", "out-file", "out-dir", "out-path"

struct PathTag {
  PathRole role;
  // What is (or will be) there, in a word the harness maps to a real artifact: "run" (a run directory),
  // "weights" (a weights file, Hugging Face directory or GGUF file), "tokens" (a token file), "text",
  // "tokenizer", "safetensors", "gguf", "hf", "config", "rdata"; for outputs the writer's own kind.
  std::string holds;
};

// The tags of the options defined so far, by option (filled by the functions below; cli/options.cpp defines it).
std::map<const CLI::Option*, PathTag>& path_tags();

inline CLI::Option* tag_path(CLI::Option* opt, PathRole role, std::string holds) {
  path_tags()[opt] = PathTag{role, std::move(holds)};
  const bool dir = role == PathRole::InDir || role == PathRole::OutDir;
  const bool file = role == PathRole::InFile || role == PathRole::OutFile;
  return opt->type_name(dir ? "DIR" : file ? "FILE" : "PATH");
}
inline CLI::Option* in_file(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::InFile, std::move(holds)); }
inline CLI::Option* in_dir(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::InDir, std::move(holds)); }
inline CLI::Option* in_path(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::InPath, std::move(holds)); }
inline CLI::Option* out_file(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::OutFile, std::move(holds)); }
inline CLI::Option* out_dir(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::OutDir, std::move(holds)); }
inline CLI::Option* out_path(CLI::Option* opt, std::string holds) { return tag_path(opt, PathRole::OutPath, std::move(holds)); }

}  // namespace loom::cli
