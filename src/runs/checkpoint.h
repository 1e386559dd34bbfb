// Checkpoint directories on disk: DIR/checkpoints/step_<N>/ (N zero-padded to 8 digits), each holding
//   model.safetensors      the parameters under their dotted names (runs/load.h's save_model_weights)
//   optimizer.safetensors  "step" (I64) and "<param>.exp_avg" / "<param>.exp_avg_sq" (F32)
//   trainer_state.json     step, RNG keys, data-loader state, resolved config, tokenizer hash, metrics
//   manifest.json          written last: every other file's byte size and sha256
//
// Atomicity: a checkpoint is assembled in DIR/checkpoints/.tmp-step_<N>-<pid>/ (every file fsync'ed as it
// is written, the manifest last, then the directory fsync'ed), renamed to step_<N> in one rename(2), and
// DIR/checkpoints is fsync'ed. Readers ignore names that do not match step_<digits>, so a crash leaves at
// worst a stray temporary directory, never a step_<N> with missing files. On top of that, a checkpoint is
// only loaded after its manifest is checked (every file present, same size, same sha256), so a
// checkpoint damaged after the fact (a disk error, a hand edit) is reported and skipped as well.
//
// What the files mean and how training uses them: trainer.h (save_checkpoint / resume) and
// docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::runs {

// "step_00000500".
std::string checkpoint_name(int64_t step);
// <run_dir>/checkpoints
std::string checkpoints_dir(const std::string& run_dir);

struct CheckpointRef {
  int64_t step = 0;
  std::string path;  // the step_<N> directory
};

// The step_<N> directories under <run_dir>/checkpoints, oldest first. Does not validate them.
std::vector<CheckpointRef> list_checkpoints(const std::string& run_dir);

// Why the checkpoint directory is not usable (missing manifest or file, size or hash mismatch, step in
// the manifest not matching the name), or nullopt when it is complete and intact.
std::optional<std::string> checkpoint_problem(const std::string& dir);

// The newest checkpoint that passes checkpoint_problem; every newer one that fails is passed to
// `skipped` (path and reason) and passed over.
std::optional<CheckpointRef> latest_valid_checkpoint(
    const std::string& run_dir, const std::function<void(const std::string& path, const std::string& why)>& skipped = {});

// One file of a checkpoint: its name inside the directory and a function that writes it at the path
// given (durably: write_file_atomically or write_safetensors).
struct CheckpointFile {
  std::string name;
  std::function<void(const std::string& path)> write;
};

// Whether loom wrote the checkpoint directory: its manifest.json is loom's ("format": "loom-checkpoint")
// and the directory holds exactly the files the manifest lists, plus the manifest (it may still be
// damaged: see checkpoint_problem). Only such directories are ever deleted or replaced by loom.
bool checkpoint_written_by_loom(const std::string& dir);

// Writes the files into a temporary directory, then the manifest, fsyncs, and renames it to
// <run_dir>/checkpoints/step_<N>. `before_file` (a test hook, may be empty) is called with each file name
// before it is written. When a valid step_<N> already exists (a resumed run saving the step it started
// from), nothing is written; a damaged one that loom wrote is replaced; a step_<N> loom did not write is
// an error. Returns the checkpoint's path.
std::string write_checkpoint(const std::string& run_dir, int64_t step, const std::vector<CheckpointFile>& files,
                             const std::function<void(const std::string& file)>& before_file = {});

// Retention: keeps the newest `keep_last` checkpoints (all when 0) and `also_keep` (e.g. the best by
// validation loss), deletes the others (each renamed away first, so a crash mid-delete leaves no
// half-deleted step_<N>). Also removes temporary directories left by crashed writers. Returns the
// deleted steps. Only what loom wrote is deleted (checkpoint_written_by_loom; leftovers named and filled
// as loom names and fills them); other step_<N> folders are left alone and not counted. The newest valid
// checkpoint is always kept, even when newer damaged ones fill keep_last; `known_valid` names a step the
// caller has just written and verified, which spares re-reading it.
std::vector<int64_t> apply_retention(const std::string& run_dir, int64_t keep_last,
                                     const std::vector<int64_t>& also_keep = {},
                                     std::optional<int64_t> known_valid = std::nullopt);

// Deletes every checkpoint loom wrote under <run_dir>/checkpoints and the leftovers of crashed writers,
// then checkpoints/ itself when nothing else is in it (`loom train --overwrite`). Returns the deleted
// paths, relative to run_dir.
std::vector<std::string> delete_checkpoints(const std::string& run_dir);

}  // namespace loom::runs
