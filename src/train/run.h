// A training run from its config to its samples: what `loom train` does, callable from C++ and Python
// (loom.train) without the CLI.
//
// run_training goes through the run's whole life, in this order:
//   1. --weights: the model section becomes the weights' own, their tokenizer goes where the data section
//      points (start_from_weights);
//   2. the whole run's memory (train/memory.h) against the budget, before anything is read or written;
//   3. rank 0 claims the run directory (runs/run_dir.h: a new or empty directory, or one of loom's runs
//      to resume or overwrite; locked until run_training returns) and prepares the tokenizer and token
//      files the config names when they are missing; the other ranks wait for it;
//   4. the trainer, the start weights copied in, the newest valid checkpoint loaded on resume;
//   5. training until max_steps or a stop signal (SIGINT, SIGTERM: train/stop_signal.h, alive for the
//      whole call), the final weights (gathered when sharded), the tokenizer and how the run ended
//      (run.json);
//   6. samples, unless the run was stopped.
// It reports as it goes through TrainRunEvents and returns how the run ended; it prints nothing itself
// (the trainer's progress lines aside: logging.progress). The caller turns the outcome into messages and
// an exit status (cli/train.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mesh/launch.h"
#include "models/model.h"
#include "runs/load.h"
#include "runs/memory.h"
#include "runs/run_dir.h"
#include "tokenizer/tokenizer.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

struct TrainRunOptions {
  std::string out;  // the run directory
  // What to do with one of loom's runs already in `out`: refuse it, continue it from its newest valid
  // checkpoint (its config is the caller's to choose: TrainConfig::load of out/config.json), or replace it.
  runs::ExistingRun existing = runs::ExistingRun::Refuse;
  // Start from these weights, with their tokenizer (start_from_weights); "" for a new model. One process.
  std::string weights;
  // The "key=value" overrides the config was loaded with: with `weights`, they say which model and data
  // keys the user chose (start_from_weights).
  std::vector<std::string> sets;
  runs::MemoryBudget budget = runs::MemoryBudget::of_machine();
  // This rank of a sharded run (start_ranks); null for one process.
  std::shared_ptr<const dist::RankContext> rank_context;
  // Progress of the tokenizer training and data preparation (ensure_training_data).
  bool data_progress = true;
  // Generate config.sample.num_samples samples at the end (rank 0 only).
  bool samples = true;
  // Test hook, passed to Trainer::before_checkpoint_file.
  std::function<void(const std::string& file)> before_checkpoint_file;
};

// How a run ended.
struct TrainOutcome {
  TrainSummary summary;
  int64_t max_steps = 0;
  std::string run_dir;
  std::string weights_path;        // run_dir/model.safetensors
  bool writer = true;              // this rank wrote the run's files (rank 0, or the only rank)
  // A stop was asked for: before the last step (summary.stopped_early: the run is "interrupted" and
  // resumes from its last checkpoint), or, on rank 0, after it (the training is complete and "finished";
  // the samples were skipped). The command that ran it ends as interrupted either way.
  bool stopped = false;
  int signal = 0;                  // the signal that asked (SIGINT, SIGTERM); 0 when none did
};

// What run_training reports as it goes; every member may be left empty.
struct TrainRunEvents {
  // A line for the console, from rank 0: the data paths and what was prepared, the checkpoint resumed
  // from (or skipped), the files --overwrite deleted, the run's size and mesh.
  std::function<void(const std::string& line)> note;
  // Rank 0, once the weights and tokenizer are saved and run.json says how the run ended, before the
  // samples (`outcome.stopped` is not final yet: a stop during sampling sets it after).
  std::function<void(const TrainOutcome& outcome)> ended;
  // Each sample as it is generated: its index from 0 and the text after the prompt.
  std::function<void(int64_t index, const std::string& text)> sample;
};

TrainOutcome run_training(TrainConfig& config, const TrainRunOptions& options, const TrainRunEvents& events = {});

// The run directory `loom train` uses when none is given: runs/<preset or config file name>.
std::string default_run_dir(const std::string& config);

// `weights` as the start of a training run: the model section becomes the weights' own (of `sets`, only
// model.context_length may touch it, as it changes no parameter), and the data section points at the
// weights' tokenizer and token files made with it, in data/<weights name>/ unless `sets` names
// data.tokenizer/train/val; the tokenizer is written there when missing. Returns the loaded weights, whose
// parameters run_training copies into the trainer's model before step 0.
runs::LoadedRun start_from_weights(TrainConfig& config, const std::string& weights,
                                   const std::vector<std::string>& sets, const runs::MemoryBudget& budget);

// config.sample.num_samples continuations of config.sample.prompt, sample i seeded with training.seed + i,
// stopping at <|endoftext|> when the tokenizer has it; `on_sample` gets each as it is made.
void generate_samples(const TrainConfig& config, const models::LanguageModel& model, const tokenizer::Tokenizer& tok,
                      const std::function<void(int64_t index, const std::string& text)>& on_sample);

// This process as one rank of the mesh the config names (parallel.mesh, parallel.mode), joined as
// dist::join_launched_ranks does (nulls for one process alone). On a mesh, training.threads = 0 becomes
// this rank's share of the node's cores, and the context takes parallel.max_expert_rows and `overlap`.
dist::LaunchedRank start_ranks(TrainConfig& config, bool overlap = true);

}  // namespace loom::train
