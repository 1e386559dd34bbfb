// The training configuration: one JSON file with sections model, optimizer, schedule, data, training,
// eval, checkpoint, logging, sample.
//
// Resolution: built-in defaults <- preset or file (`--config tiny` or `--config path.json`) <- `--set
// section.key=value` overrides. A preset or a file states what differs from its base: the preset its
// "base" key names, else the built-in defaults (train/presets.h, train/config_file.h). Every
// layer is checked against the defaults' keys and types, so an unknown key, a wrong type or an
// impossible value fails before training starts, naming the key:
//   config: optimizer.lr must be a number, got "abc"
// Presets live in configs/*.json, state only what differs from their base, and are compiled in at build
// time so that `--config tiny` works from any directory (train/presets.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "io/json_checked.h"
#include "models/model_config.h"

namespace loom::train {

struct OptimizerConfig {
  double lr = 1e-3;
  double min_lr = 1e-4;  // the cosine schedule's floor
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global L2 norm of the gradient; 0 disables clipping
};

struct ScheduleConfig {
  int64_t warmup_steps = 100;  // linear warmup from 0 to lr
  int64_t cosine_steps = 0;    // step where the cosine reaches min_lr; 0 means training.max_steps
};

struct DataConfig {
  std::string corpus = "data/austen";  // text the tokenizer is trained on and tokens are prepared from
  double val_fraction = 0.1;           // share of the corpus held out for validation
  std::string tokenizer = "data/austen_bpe/tokenizer.json";
  std::string train = "data/austen_bpe/train.bin";
  std::string val = "data/austen_bpe/val.bin";
};

struct TrainingConfig {
  int64_t max_steps = 1000;
  int64_t batch_size = 16;        // sequences per micro-batch
  int64_t grad_accum_steps = 1;   // micro-batches per optimizer step
  uint64_t seed = 1337;
  int64_t threads = 0;            // 0: all cores
  data::Sampling sampling = data::Sampling::Random;
  std::string precision = "f32";  // "f32", or "bf16": mixed-precision GEMMs, f32 master weights
  // Activation recomputation (models::Recompute): "none", "full" (keep each block's input, run the block
  // again in backward) or "selective" (keep the GEMMs' outputs, run the cheap ops again). Same bits.
  std::string recompute = "none";
  // Where the step runs: "cpu", or "cuda" / "cuda:N" (one process; train/device.h). Not part of a run's
  // identity: a checkpoint written on a GPU resumes on the CPU and back.
  std::string device = "cpu";
};

struct EvalConfig {
  int64_t interval = 100;  // steps between validation passes; 0 disables
  int64_t batches = 8;     // fixed validation batches per pass
};

struct CheckpointConfig {
  int64_t interval = 500;  // steps between checkpoints; 0 disables
  int64_t keep_last = 2;   // checkpoints kept; 0 keeps all
};

struct LoggingConfig {
  int64_t interval = 10;           // steps between metrics lines
  std::string progress = "auto";   // "auto" (bar on a terminal), "bar", "lines", "none"
  double peak_flops = 0;           // FLOP/s that MFU divides by; 0 estimates the CPU's fp32 peak
};

struct SampleConfig {
  std::string prompt = "It is a truth universally acknowledged";
  int64_t num_samples = 2;
  int64_t max_new_tokens = 128;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 50;        // 0 = off
  double top_p = 1.0;        // 1 = off
};

// How the run is spread over ranks (src/mesh/mesh.h, docs/mesh.md): the device mesh and the parallel mode.
// The mesh size must equal the number of ranks started (mpirun -np / srun -n); one rank trains alone.
struct ParallelConfig {
  std::string mode = "dp";                // "dp", "fsdp", "tp", "fsdp_tp", "dp_ep" or "fsdp_ep"
  std::string mesh = "data=1,tensor=1";   // axis sizes, as --mesh takes them ("data=2,expert=4")
  // Expert parallelism: the most token rows a rank may receive for its experts in one MoE layer; more
  // is an error naming the counts instead of an allocation the machine cannot serve. 0: no cap.
  int64_t max_expert_rows = 0;
  // The pipe axis (--mesh pipe=P,...; docs/mesh.md): the micro-batch schedule, "1f1b", "gpipe" or
  // "interleaved" (the micro-batches are training.grad_accum_steps), and the blocks of each stage, "3,1",
  // or "" to balance the stages by estimated cost. Interleaved 1F1B runs virtual_stages (>= 2) stages
  // per rank, so pipe_layers then lists pipe x virtual_stages counts.
  std::string schedule = "1f1b";
  std::string pipe_layers;
  int64_t virtual_stages = 1;
};

struct TrainConfig {
  std::string description;
  models::ModelConfig model;  // the `model` section: model.arch picks the family, the rest is its keys
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DataConfig data;
  TrainingConfig training;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  SampleConfig sample;
  ParallelConfig parallel;

  // Resolves `preset_or_file` (a preset name, or a path to a JSON file; empty means "default") and
  // applies "section.key=value" overrides in order. Throws loom::Error naming the key on any problem.
  static TrainConfig load(const std::string& preset_or_file, const std::vector<std::string>& overrides = {});
  // Defaults <- `j` (complete or partial), checked and validated. The model section's defaults are
  // those of the family j["model"]["arch"] names (llama when absent).
  static TrainConfig from_json(const nlohmann::json& j);
  // Every key with its default, the model section that of `arch`'s family.
  static nlohmann::json defaults_json(const std::string& arch = "llama");
  // The relations between keys of sections other than `model` (the family declares those), checked by
  // validate() and listed by `loom options --json`: optimizer.min_lr at most optimizer.lr.
  static const std::vector<io::KeyRelation>& relations();
  // The complete, resolved configuration.
  nlohmann::json to_json() const;
  // Writes to_json() to <run_dir>/config.json (creating run_dir); returns the path.
  std::string write(const std::string& run_dir) const;

  // Checks the values that depend on one another or on the data; from_json calls it.
  void validate() const;
  // Checks that a batch fits in the data: train_tokens and val_tokens are the token files' sizes.
  // (The loader checks again when it opens a file; this names the config keys.)
  void check_data_size(int64_t train_tokens, int64_t val_tokens) const;

  int64_t cosine_steps() const { return schedule.cosine_steps > 0 ? schedule.cosine_steps : training.max_steps; }
  // Tokens consumed per optimizer step: batch_size * grad_accum_steps * context_length.
  int64_t tokens_per_step() const {
    return training.batch_size * training.grad_accum_steps * model.context_length();
  }
};

// Shorthand for TrainConfig::load (cli/bench.cpp calls it by this name).
inline TrainConfig load_config(const std::string& preset_or_file, const std::vector<std::string>& overrides = {}) {
  return TrainConfig::load(preset_or_file, overrides);
}

// Parses one "section.key=value" override into (path, value): the value is read as JSON when it parses
// as JSON, else taken as a string.
std::pair<std::string, nlohmann::json> parse_override(const std::string& assignment);

}  // namespace loom::train
