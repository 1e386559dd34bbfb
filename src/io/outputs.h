// The one rule for every writer (issue 32), in one place: train, import and export (through
// runs::RunDir), prepare, tokenizer train, plot, corpus, bench roofline and eval --logits-out (through the
// CLI, cli/main.cpp, which applies it to every option tagged as an output in cli/command.h), and any
// command added later that tags its path options.
//
//   * An output is never the same path as one of the command's inputs, nor inside one: `loom export --run
//     runs/t --out runs/t` (or runs/t/hf) is refused before anything is written. A run directory (train,
//     import, export), which --overwrite empties of loom's files, does not hold an input either. (A token
//     directory may hold its tokenizer: prepare adds train.bin, val.bin and meta.json beside it.)
//   * A directory loom marked as a run (DIR/run.json, runs/run_dir.h) belongs to the command that wrote
//     it: no other command writes into it or below it (a token file, a plot, a tokenizer dropped among a
//     run's checkpoints). RunDir::claim lets the run's own kind replace it with --overwrite, and nothing
//     else (an export never deletes a training run's checkpoints).
//   * A file a command writes under a name the user gave (eval --logits-out, tokenizer train --out x.json)
//     is new: an existing file there may be the user's or another command's input, and is not replaced.
//     (export --format gguf replaces a GGUF file with --overwrite, its own kind, and nothing else.)
//
// Paths are compared after resolving `.`, `..` and symlinks of the parts that exist
// (std::filesystem::weakly_canonical), so `runs/t/.` and a symlink to runs/t are the same run.
#pragma once

#include <optional>
#include <string>

namespace loom::io {

// The loom run directory that `path` is or lies inside (the nearest directory at or above it that holds
// loom's run.json), if any.
std::optional<std::string> enclosing_run(const std::string& path);

// Throws loom::Error when `out` equals `in` or lies inside it, and with `replaces` (the output is a run
// directory that --overwrite may empty) when it holds `in`. `what` leads the message ("export --out"),
// `in_what` names the input ("--run").
void check_output_apart(const std::string& what, const std::string& out, const std::string& in_what,
                        const std::string& in, bool replaces = true);

// Throws loom::Error when `out` is or lies inside a loom run directory other than `own_run` (a writer that
// may add its own files to one run: `loom plot DIR` draws into DIR).
void check_output_outside_runs(const std::string& what, const std::string& out, const std::string& own_run = "");

// Throws loom::Error when a file (or anything but a directory) exists at `out`.
void check_output_file_new(const std::string& what, const std::string& out);

}  // namespace loom::io
