// The training loop behind `loom train`: AdamW with clipping and warmup + cosine, gradient
// accumulation, validation on a fixed set of batches, metrics.jsonl, console progress, a clean stop on
// Ctrl-C, and skipping (and counting) steps whose loss or gradient is not finite.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/runtime.h"
#include "models/model.h"
#include "runs/checkpoint.h"
#include "train/config.h"
#include "train/memory.h"
#include "train/optimizer.h"
#include "train/stop_signal.h"

namespace loom::train {

struct TrainSummary {
  int64_t steps_completed = 0;    // optimizer steps taken or skipped, in total, including earlier runs
  int64_t steps_skipped = 0;      // steps whose loss or gradient was not finite
  double last_loss = 0;
  std::optional<double> first_val_loss, last_val_loss;
  double tokens_per_s = 0;        // over this run's steps
  bool stopped_early = false;     // Ctrl-C / SIGTERM before max_steps (or before the last validation)
};

class Trainer {
 public:
  // Opens the data named by the config (checking sizes and vocabulary), builds the model and optimizer.
  // Refuses (loom::Error) a config whose memory estimate exceeds `memory` before allocating (runs/memory.h).
  Trainer(TrainConfig config, std::string run_dir, const runs::MemoryBudget& memory = runs::MemoryBudget::of_machine());
  // One rank of a sharded run (docs/mesh.md): the model is sharded over `dist`'s mesh in `dist`'s mode
  // right after it is built. Every rank runs the same calls (steps, validation and checkpoints talk to
  // the others); rank 0 writes the run's files (metrics, config, the final weights, gathered), and every
  // rank writes its blocks of each checkpoint (parallel/checkpoint.h), which resumes on any mesh or mode.
  Trainer(TrainConfig config, std::string run_dir, const runs::MemoryBudget& memory,
          std::shared_ptr<const dist::RankContext> dist);

  // Trains from the current step to training.max_steps, or until `stop` is requested. `stop` is looked at
  // between micro-batches and between validation batches: a step interrupted before its last micro-batch
  // is not applied (the run stops at the last completed step, which a resume continues from exactly as if
  // uninterrupted), and a validation pass interrupted midway is redone first on resume.
  TrainSummary run(const StopSignal* stop = nullptr);

  // Test hook: called after backward() and before clipping, with the step and the gradients.
  std::function<void(int64_t step, std::vector<Tensor>& grads)> after_backward;

  // Checkpoints (layout and atomicity: runs/checkpoint.h). run() saves one every checkpoint.interval
  // steps, at the end, and when stopped (none when checkpoint.interval is 0), then applies retention:
  // the newest checkpoint.keep_last plus the best by validation loss (among checkpoints saved at a step
  // where validation ran).
  // Writes DIR/checkpoints/step_<N> for the current step; returns its path.
  std::string save_checkpoint();
  // Restores everything a checkpoint holds: parameters, optimizer moments and step count, the data
  // loader's position, step and skip counters, validation history. Throws if the checkpoint does not
  // match this trainer's model, seed, batch shape or tokenizer.
  void load_checkpoint(const std::string& dir);
  // Loads the newest valid checkpoint of the run directory, if any; each newer invalid one is reported
  // through `skipped` (path and reason). Returns the step resumed from. (run() from step 0 without a
  // resume() call refuses a directory that already holds checkpoints: a later --resume would otherwise
  // pick up the earlier run's newer checkpoints.)
  std::optional<int64_t> resume(const std::function<void(const std::string& path, const std::string& why)>& skipped = {});
  // Test hook: called with each checkpoint file's name just before it is written.
  std::function<void(const std::string& file)> before_checkpoint_file;

  // Mean loss over the fixed validation batches.
  double validation_loss();

  // The whole model's weights to `path` (save_model_weights' format). Collective when sharded: every rank
  // calls it, rank 0 writes.
  void save_weights(const std::string& path);
  // Whether this rank writes the run's files (rank 0, or the only rank).
  bool writes_files() const { return !dist_ || dist_->rank == 0; }
  const dist::RankContext* rank_context() const { return dist_.get(); }

  const TrainConfig& config() const { return config_; }
  models::LanguageModel& model() { return *model_; }
  // training.device: the parameters, optimizer moments and batches are there (train/device.h).
  Device device() const { return device_; }
  AdamW& optimizer() { return *optimizer_; }
  int64_t step() const { return step_; }

 private:
  struct Data;
  TrainConfig config_;
  std::shared_ptr<const dist::RankContext> dist_;  // null: one process
  Device device_;                                  // training.device: where parameters and batches live
  std::vector<dist::TensorLayout> layout_;         // when sharded, indexed like model_->parameters()
  std::string run_dir_;
  std::unique_ptr<models::LanguageModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::shared_ptr<Data> data_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
  bool resume_attempted_ = false;  // resume() was called (a fresh start after it is deliberate)
  // Validation history, kept across resumes.
  std::optional<double> first_val_loss_, last_val_loss_;
  int64_t last_val_step_ = -1;
  std::optional<int64_t> best_checkpoint_step_;  // the checkpoint with the lowest validation loss
  double best_checkpoint_val_ = 0;
  nlohmann::json last_train_event_;  // the last metrics line written, for trainer_state.json

  bool val_pending_ = false;  // validation of the current step was interrupted: run it first on resume

  nlohmann::json state_json() const;
  // The forward context of micro-batch `micro` of the current step: dropout keyed by (seed, step, micro).
  models::ForwardContext train_context(int64_t micro) const;
  // Mean validation loss, or nullopt when `stop` was requested before the last batch.
  std::optional<double> validation_loss(const StopSignal* stop);
  // What differs when sharded (src/parallel/runtime.h): this rank's rows of a batch tensor, the global loss,
  // the gradients completed after backward(), the global norm, and a stop all ranks agree on.
  Tensor local(const Tensor& batch_tensor) const;
  double global(double local_loss) const;
  void finish_gradients();
  double clip_or_norm(const std::vector<Tensor>& grads);
  bool agreed(bool stop) const;
  // The mesh has a pipe axis: steps and validation run through parallel/pipeline.h.
  bool pipelined() const { return dist_ && dist_->mesh.pipe > 1; }
  // Whole parameter tensors (gathered when sharded: collective).
  std::vector<Tensor> whole_parameters();
  // The trainer_state.json of a checkpoint; a sharded checkpoint's save (parallel/checkpoint.h).
  runs::CheckpointFile state_file() const;
  std::string save_sharded_checkpoint();
};

}  // namespace loom::train
