#include "train/trainer.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <cmath>
#include <filesystem>

#include "backends/cpu/peak.h"
#include "core/autograd.h"
#include "core/parallel.h"
#include "core/thread_count.h"
#include "data/batch.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "ops/elementwise.h"
#include "tokenizer/formats.h"
#include "runs/checkpoint.h"
#include "parallel/checkpoint.h"
#include "parallel/pipeline.h"
#include "train/device.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_data.h"
#include "runs/load.h"

namespace loom::train {

struct Trainer::Data {
  data::BatchLoader train;
  std::vector<data::Batch> val;
};

Trainer::Trainer(TrainConfig config, std::string run_dir, const runs::MemoryBudget& memory)
    : Trainer(std::move(config), std::move(run_dir), memory, nullptr) {}

Trainer::Trainer(TrainConfig config, std::string run_dir, const runs::MemoryBudget& memory,
                 std::shared_ptr<const dist::RankContext> dist)
    : config_(std::move(config)), dist_(std::move(dist)), run_dir_(std::move(run_dir)) {
  config_.validate();
  device_ = training_device(config_.training.device, config_.parallel.mesh, "train");
  runs::check_memory(training_memory(config_), memory_budget(device_, memory), "train");
  if (config_.training.threads > 0) {
    set_num_threads(static_cast<int>(clamp_to_cores(config_.training.threads, "training.threads")));
  }
  // The loaders, with the data checks that name config keys (src/train/run_data.h); validation uses a
  // fixed set of batches drawn once.
  RunData run_data = open_run_data(config_);
  std::vector<data::Batch> val;
  if (run_data.val) val = run_data.val->fixed_batches(config_.eval.batches);
  data_ = std::make_shared<Data>(Data{std::move(run_data.train), std::move(val)});

  model_ = config_.model.build(config_.training.seed);
  move_to_device(*model_, device_);  // before the optimizer: its moments are made beside the parameters
  if (config_.training.precision == "bf16") model_->set_matmul_precision(ops::MatmulPrecision::BF16);
  if (dist_) layout_ = dist::shard_model(*model_, dist_);  // before the optimizer: its moments follow the shards
  const auto& o = config_.optimizer;
  optimizer_ = std::make_unique<AdamW>(
      model_->parameters(), AdamWOptions{static_cast<float>(o.lr), static_cast<float>(o.beta1),
                                         static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                         static_cast<float>(o.weight_decay)});
}

double Trainer::validation_loss() { return *validation_loss(nullptr); }

std::optional<double> Trainer::validation_loss(const StopSignal* stop) {
  autograd::NoGradGuard no_grad;
  double total = 0;
  for (const data::Batch& b : data_->val) {
    if (stop != nullptr && agreed(stop->requested())) return std::nullopt;  // thousands of batches must not delay a stop
    total += pipelined() ? dist::pipeline_loss(*model_, local(b.inputs), local(b.targets), *dist_)
                         : global(model_->loss(local(b.inputs), local(b.targets)).to(Device::cpu()).item());
  }
  return data_->val.empty() ? 0.0 : total / static_cast<double>(data_->val.size());
}

TrainSummary Trainer::run(const StopSignal* stop) {
  if (step_ == 0 && !resume_attempted_ && config_.checkpoint.interval > 0) {
    auto existing = runs::list_checkpoints(run_dir_);
    LOOM_CHECK(existing.empty(), "train: ", runs::checkpoints_dir(run_dir_), " already holds checkpoints (newest: step ",
               existing.empty() ? 0 : existing.back().step,
               ") from an earlier run: continue it with --resume, or train into another --out directory");
  }
  const bool writer = writes_files();
  if (writer) {
    std::filesystem::create_directories(run_dir_);
    config_.write(run_dir_);
  }
  const auto& tc = config_.training;
  const auto& oc = config_.optimizer;
  std::optional<MetricsWriter> metrics;  // rank 0's only
  if (writer) metrics.emplace(run_dir_, step_ > 0 ? std::optional<int64_t>(step_) : std::nullopt, val_pending_);
  Progress progress(tc.max_steps, writer ? progress_mode_from_name(config_.logging.progress, stderr)
                                         : progress_mode_from_name("none", stderr),
                    stderr, step_);
  const double flops_per_token = config_.model.stats().palm_flops_per_token();
  // MFU's denominator. Measured for 0.3 s, it comes out low on a busy host (MFU above 100% was shown, issue
  // 32): the larger of the measurement and /proc/cpuinfo's estimate, and never below the rate the
  // training itself reached (raised below when a window exceeds it), so MFU cannot pass 100%.
  // On a GPU: its measured matrix rate in the step's precision.
  double peak = config_.logging.peak_flops > 0 ? config_.logging.peak_flops
                : device_.is_cuda()
                    ? gpu_matrix_peak_flops(device_, config_.training.precision == "bf16")
                    : std::max(cpu::measure_fma_peak(num_threads(), 0.3).gflops * 1e9,
                               estimate_cpu_peak_flops(num_threads())) *
                          (dist_ ? static_cast<double>(dist_->mesh.size()) : 1.0);
  const int64_t tokens_per_step = config_.tokens_per_step();
  auto params = model_->parameters();

  TrainSummary summary;
  auto stop_requested = [&] { return agreed(stop != nullptr && stop->requested()); };
  auto validate_now = [&] {
    if (stop != nullptr) stop->set_step(step_);
    std::optional<double> loss = validation_loss(stop);
    val_pending_ = !loss.has_value();
    if (val_pending_) return;
    const double v = *loss;
    LOOM_CHECK(std::isfinite(v), "train: the validation loss at step ", step_, " is ", v,
               ": the model's outputs are not finite, so training stops here rather than go on with a broken "
               "model (the checkpoints saved before this step are kept)");
    if (!first_val_loss_) first_val_loss_ = v;
    last_val_loss_ = v;
    last_val_step_ = step_;
    summary.first_val_loss = first_val_loss_;
    summary.last_val_loss = last_val_loss_;
    ValEvent e{step_, v};
    if (metrics) metrics->val(e);
    progress.log_val(e);
  };
  // The starting point of the val curve, or a validation that an earlier stop interrupted.
  if ((step_ == 0 && config_.eval.interval > 0) || val_pending_) validate_now();
  bool interrupted = stop_requested(), saved = false;

  using Clock = std::chrono::steady_clock;
  const auto run_start = Clock::now();
  auto window_start = run_start;
  int64_t window_steps = 0, run_steps = 0;
  double window_pipe_seconds = 0, window_pipe_busy = 0;  // the pipe axis's step time and busy time, this rank
  while (!interrupted && step_ < tc.max_steps) {
    if (stop != nullptr) stop->set_step(step_ + 1);
    const float lr = cosine_lr(step_, static_cast<float>(oc.lr), static_cast<float>(oc.min_lr),
                               config_.schedule.warmup_steps, config_.cosine_steps());
    optimizer_->zero_grad();
    model_->begin_training_step();
    double loss_sum = 0;
    const data::LoaderState loader_at_step_start = data_->train.state();
    int64_t micro = 0;
    if (pipelined()) {
      // The pipe axis: the step's micro-batches flow through the stages (parallel/pipeline.h); a stop is
      // looked at only between steps.
      std::vector<dist::MicroBatch> batches;
      for (int64_t m = 0; m < tc.grad_accum_steps; ++m) {
        data::Batch batch = data_->train.next();
        batches.push_back({local(batch.inputs), local(batch.targets), train_context(m)});
      }
      dist::PipelineTiming timing;
      loss_sum = dist::pipeline_step(*model_, params, batches, *dist_, &timing);
      window_pipe_seconds += timing.seconds;
      window_pipe_busy += timing.busy_seconds;
      micro = tc.grad_accum_steps;
    }
    for (; micro < tc.grad_accum_steps; ++micro) {
      // A stop between micro-batches abandons the step: nothing is applied and the loader goes back to
      // where the step began, so the run ends at the last completed step and a resume redoes this one.
      if (micro > 0 && stop_requested()) break;
      data::Batch batch = data_->train.next();  // the global batch: every rank reads the same one
      Tensor loss = model_->loss(local(batch.inputs), local(batch.targets), train_context(micro));
      loss_sum += global(loss.to(Device::cpu()).item());  // on a GPU this read waits for the forward pass
      // Mean over micro-batches: each contributes 1/accum of the gradient.
      const Tensor scaled = tc.grad_accum_steps > 1 ? ops::scale(loss, 1.0f / static_cast<float>(tc.grad_accum_steps)) : loss;
      if (dist_) {
        dist::backward(scaled, params, *dist_, micro + 1 == tc.grad_accum_steps);  // may start gradient all-reduces
      } else {
        scaled.backward();
      }
    }
    if (micro < tc.grad_accum_steps) {
      data_->train.restore(loader_at_step_start);
      progress.note(str("step ", step_ + 1, " abandoned after ", micro, " of ", tc.grad_accum_steps,
                        " micro-batches (not applied)"));
      interrupted = true;
      break;
    }
    const double loss_value = loss_sum / static_cast<double>(tc.grad_accum_steps);
    finish_gradients();
    std::vector<Tensor> grads = gradients_of(params);
    if (after_backward) after_backward(step_, grads);
    const double grad_norm = clip_or_norm(grads);
    const bool finite = std::isfinite(loss_value) && std::isfinite(grad_norm);
    if (finite) optimizer_->step(lr);
    // After the optimizer: DeepSeek-V3 moves its routing biases by this step's loads (not a gradient).
    model_->end_training_step(finite);
    if (!finite) {
      ++skipped_;
      if (metrics) metrics->write({{"event", "skip"}, {"step", step_ + 1}, {"loss", loss_value}, {"grad_norm", grad_norm},
                     {"skipped_total", skipped_}});
      progress.note(str("step ", step_ + 1, ": non-finite ", std::isfinite(loss_value) ? "gradient" : "loss",
                        ", update skipped (", skipped_, " so far)"));
    }
    ++step_;
    ++window_steps;
    ++run_steps;
    summary.last_loss = loss_value;

    if (step_ % config_.logging.interval == 0 || step_ == tc.max_steps) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      TrainEvent e;
      e.step = step_;
      e.loss = loss_value;
      e.lr = lr;
      e.grad_norm = grad_norm;
      e.tokens_per_s = static_cast<double>(window_steps * tokens_per_step) / seconds;
      peak = std::max(peak, flops_per_token * e.tokens_per_s);
      e.mfu = mfu(flops_per_token, e.tokens_per_s, peak);
      e.model = model_->take_training_metrics();
      if (pipelined()) {
        // The bubble: the share of the steps' forward and backward that the ranks spent waiting for a
        // neighbour, averaged over the ranks, beside the (P - 1) / (M + P - 1) of equal stages.
        double idle[2] = {window_pipe_seconds - window_pipe_busy, window_pipe_seconds};
        dist_->comm->all_reduce_sum(idle, 2, dist_->comm->world());
        e.model["pipe_bubble"] = idle[1] > 0 ? idle[0] / idle[1] : 0.0;
        e.model["pipe_bubble_ideal"] = dist::ideal_bubble(dist_->mesh.pipe, tc.grad_accum_steps, dist_->pipe_chunks);
        window_pipe_seconds = window_pipe_busy = 0;
      }
      if (metrics) metrics->train(e);
      last_train_event_ = to_json(e);
      progress.log(e);
      window_start = Clock::now();
      window_steps = 0;
    }
    progress.update(step_);
    if (config_.eval.interval > 0 && (step_ % config_.eval.interval == 0 || step_ == tc.max_steps)) validate_now();
    const bool stopping = stop_requested();
    const int64_t every = config_.checkpoint.interval;
    saved = every > 0 && (step_ % every == 0 || step_ == tc.max_steps || stopping);  // of step_, if true
    if (saved) {
      std::string path = save_checkpoint();
      if (stopping) progress.note(str("checkpoint: ", path));
    }
    // A stop that arrived while this step's checkpoint was written was announced as this step ("stopping
    // after this step (step N)"): it ends the run here, not after one more step (issue 32). Asked only
    // after a save, which every rank makes alike, so the ranks still agree.
    interrupted = stopping || (saved && stop_requested());
  }
  if (interrupted) {
    // Stopped where no checkpoint of step_ was saved (mid-step, or before the first step): save one.
    if (!saved && config_.checkpoint.interval > 0) progress.note(str("checkpoint: ", save_checkpoint()));
    summary.stopped_early = step_ < tc.max_steps || val_pending_;
    if (summary.stopped_early) progress.note(str("stopping after step ", step_, " (interrupted)"));
  }
  if (stop != nullptr) stop->set_step(-1);
  progress.finish();
  summary.first_val_loss = first_val_loss_;
  summary.last_val_loss = last_val_loss_;
  const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  summary.steps_completed = step_;
  summary.steps_skipped = skipped_;
  summary.tokens_per_s = run_steps > 0 ? static_cast<double>(run_steps * tokens_per_step) / seconds : 0.0;
  if (skipped_ > 0) progress.note(str(skipped_, " step(s) skipped for non-finite loss or gradient"));
  return summary;
}

namespace {

std::string tokenizer_hash_or_empty(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) ? tokenizer::tokenizer_hash(path) : std::string();
}

nlohmann::json key_json(RngKey k) { return nlohmann::json::array({k.k0, k.k1}); }

// The config keys a checkpoint must agree on to continue the same run (the rest, like max_steps or the
// checkpoint interval, may change on resume).
nlohmann::json identity_of(const nlohmann::json& config) {
  nlohmann::json t = config.at("training");
  return {{"model", config.at("model")},
          {"seed", t.at("seed")},
          {"batch_size", t.at("batch_size")},
          {"grad_accum_steps", t.at("grad_accum_steps")},
          {"sampling", t.at("sampling")}};
}

}  // namespace

models::ForwardContext Trainer::train_context(int64_t micro) const {
  const RngKey key = RngKey::from_seed(config_.training.seed).fold_in("dropout");
  return models::ForwardContext::train(key.fold_in(static_cast<uint64_t>(step_)).fold_in(static_cast<uint64_t>(micro)),
                                       models::recompute_from_name(config_.training.recompute));
}

nlohmann::json Trainer::state_json() const {
  const RngKey root = RngKey::from_seed(config_.training.seed);
  nlohmann::json j;
  j["format"] = "loom-trainer-state";
  j["version"] = 1;
  j["step"] = step_;
  j["optimizer_steps"] = optimizer_->step_count();
  j["skipped"] = skipped_;
  j["rng"] = {{"seed", config_.training.seed},
              {"root_key", key_json(root)},
              {"train_batches_key", key_json(root.fold_in("train-batches"))},
              {"val_batches_key", key_json(root.fold_in("val-batches"))}};
  j["data_loader"] = data_->train.state();
  j["config"] = config_.to_json();
  j["tokenizer"] = {{"path", config_.data.tokenizer}, {"sha256", tokenizer_hash_or_empty(config_.data.tokenizer)}};
  j["last_train"] = last_train_event_.is_null() ? nlohmann::json() : last_train_event_;
  j["first_val_loss"] = first_val_loss_ ? nlohmann::json(*first_val_loss_) : nlohmann::json();
  j["last_val"] = last_val_loss_ ? nlohmann::json{{"step", last_val_step_}, {"val_loss", *last_val_loss_}}
                                 : nlohmann::json();
  // The validation loss of exactly this checkpoint's weights, when validation ran at this step.
  j["val_loss"] = (last_val_loss_ && last_val_step_ == step_) ? nlohmann::json(*last_val_loss_) : nlohmann::json();
  j["val_pending"] = val_pending_;
  j["best_checkpoint"] = best_checkpoint_step_
                             ? nlohmann::json{{"step", *best_checkpoint_step_}, {"val_loss", best_checkpoint_val_}}
                             : nlohmann::json();
  return j;
}

std::string Trainer::save_checkpoint() {
  if (last_val_loss_ && last_val_step_ == step_ && (!best_checkpoint_step_ || *last_val_loss_ < best_checkpoint_val_)) {
    best_checkpoint_step_ = step_;
    best_checkpoint_val_ = *last_val_loss_;
  }
  if (dist_) return save_sharded_checkpoint();
  std::vector<runs::CheckpointFile> files;
  files.push_back({"model.safetensors", [&](const std::string& path) { runs::save_model_weights(*model_, path); }});
  files.push_back({"optimizer.safetensors", [&](const std::string& path) {
                     const int64_t count = optimizer_->step_count();
                     std::vector<io::SafetensorsEntry> entries;
                     std::deque<Tensor> host_moments;  // stable addresses while entries point at them
                     entries.push_back({"step", io::SafetensorsDtype::I64, {}, &count, sizeof(count)});
                     const auto& params = optimizer_->params();
                     for (size_t i = 0; i < params.size(); ++i) {
                       for (auto [suffix, t] : {std::pair<const char*, Tensor*>{".exp_avg", &optimizer_->exp_avg(i)},
                                                {".exp_avg_sq", &optimizer_->exp_avg_sq(i)}}) {
                         if (!t->defined()) continue;  // parameter never updated yet
                         std::vector<uint64_t> shape(t->shape().begin(), t->shape().end());
                         const Tensor& host = host_moments.emplace_back(t->to(Device::cpu()));  // kept until written
                         entries.push_back({params[i]->name + suffix, io::SafetensorsDtype::F32, shape, host.data<float>(),
                                            static_cast<uint64_t>(t->numel()) * sizeof(float)});
                       }
                     }
                     io::write_safetensors(path, entries, {{"loom.optimizer", "adamw"}});
                   }});
  files.push_back(state_file());
  std::string path = runs::write_checkpoint(run_dir_, step_, files, before_checkpoint_file);
  std::vector<int64_t> keep;
  if (best_checkpoint_step_) keep.push_back(*best_checkpoint_step_);
  runs::apply_retention(run_dir_, config_.checkpoint.keep_last, keep, step_);
  return path;
}

runs::CheckpointFile Trainer::state_file() const {
  return {"trainer_state.json", [this](const std::string& path) {
            std::string text = state_json().dump(2) + "\n";
            io::write_file_atomically(path, [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
          }};
}

// Every rank writes its blocks into the temporary directory rank 0's write_checkpoint makes (its name
// is broadcast); rank 0 writes the index and the trainer state, waits for everyone's file (a barrier),
// and only then lets write_checkpoint digest them all and rename the directory (parallel/checkpoint.h).
std::string Trainer::save_sharded_checkpoint() {
  namespace fs = std::filesystem;
  const dist::RankContext& c = *dist_;
  const auto world = c.comm->world();
  auto params = model_->parameters();
  std::vector<const Tensor*> m, v;
  for (size_t i = 0; i < params.size(); ++i) {
    m.push_back(&optimizer_->exp_avg(i));
    v.push_back(&optimizer_->exp_avg_sq(i));
  }
  const std::string final_path = (fs::path(runs::checkpoints_dir(run_dir_)) / runs::checkpoint_name(step_)).string();
  if (c.rank != 0) {
    const std::string tmp = dist::broadcast_text("", 0, c);
    if (!tmp.empty()) {  // empty: rank 0 found this step's checkpoint already saved
      dist::write_rank_shards((fs::path(tmp) / dist::shard_file_name(c.rank)).string(), params, m, v, c,
                              model_->state_tensors());
      c.comm->barrier(world);
    }
    c.comm->barrier(world);
    return final_path;
  }
  bool announced = false;
  auto announce = [&](const std::string& tmp) {
    if (announced) return;
    dist::broadcast_text(tmp, 0, c);
    announced = true;
  };
  std::vector<runs::CheckpointFile> files;
  files.push_back({dist::kShardIndex, [&](const std::string& path) {
                     announce(fs::path(path).parent_path().string());
                     const std::string text = dist::shard_index(params, layout_, c, model_->state_tensors()).dump(1) + "\n";
                     io::write_file_atomically(path, [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
                   }});
  files.push_back({dist::shard_file_name(0), [&](const std::string& path) {
                     dist::write_rank_shards(path, params, m, v, c, model_->state_tensors());
                     c.comm->barrier(world);  // every rank's file is now written and fsync'ed
                   }});
  for (int r = 1; r < c.comm->size(); ++r) files.push_back({dist::shard_file_name(r), [](const std::string&) {}});
  files.push_back(state_file());
  const std::string path = runs::write_checkpoint(run_dir_, step_, files, before_checkpoint_file);
  announce("");  // still unannounced: the step was saved already and nothing was written
  std::vector<int64_t> keep;
  if (best_checkpoint_step_) keep.push_back(*best_checkpoint_step_);
  runs::apply_retention(run_dir_, config_.checkpoint.keep_last, keep, step_);
  c.comm->barrier(world);
  return path;
}

void Trainer::load_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  nlohmann::json s = io::try_parse_json(tokenizer::read_file(state_path));
  LOOM_CHECK(!s.is_discarded() && s.is_object(), state_path, " is not valid JSON");
  try {
    const nlohmann::json saved = identity_of(s.at("config")), ours = identity_of(config_.to_json());
    LOOM_CHECK(saved == ours, "checkpoint ", dir, " was written by a different run: it has ", saved.dump(),
               " but this config has ", ours.dump());
    const std::string saved_tok = s.at("tokenizer").at("sha256").get<std::string>();
    const std::string our_tok = tokenizer_hash_or_empty(config_.data.tokenizer);
    LOOM_CHECK(saved_tok.empty() || our_tok.empty() || saved_tok == our_tok, "checkpoint ", dir,
               " was trained with a tokenizer of sha256 ", saved_tok, ", but ", config_.data.tokenizer, " has ", our_tok);

    auto params = model_->parameters();
    int64_t count = 0;
    // Either one file per kind of tensor, or blocks written by the ranks of a sharded run (whole tensors
    // either way here: load_parameter and the moments below keep this rank's block).
    const bool sharded = fs::exists(fs::path(dir) / dist::kShardIndex);
    std::optional<dist::ShardedCheckpoint> shards;
    std::optional<io::SafetensorsFile> weights, opt;
    if (sharded) {
      shards.emplace(dir);
      LOOM_CHECK(shards->num_parameters() == params.size(), dir, "/", dist::kShardIndex, " lists ",
                 shards->num_parameters(), " parameters, the model has ", params.size());
      for (nn::Parameter* p : params) {
        LOOM_CHECK(shards->contains(p->name), dir, "/", dist::kShardIndex, ": missing parameter '", p->name, "'");
        model_->load_parameter(p->name, shards->whole(p->name));
      }
      for (const auto& [name, t] : model_->state_tensors()) {  // the same on every rank
        LOOM_CHECK(shards->contains(name), dir, "/", dist::kShardIndex, ": missing model state '", name, "'");
        model_->load_state(name, shards->whole(name));
      }
      count = s.at("optimizer_steps").get<int64_t>();
    } else {
      weights.emplace(io::SafetensorsFile::open((fs::path(dir) / "model.safetensors").string()));
      runs::load_model_tensors(*model_, *weights, dir + "/model.safetensors");  // parameters and model state
      opt.emplace(io::SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string()));
      const auto& step_info = opt->info("step");
      LOOM_CHECK(step_info.dtype == io::SafetensorsDtype::I64 && step_info.nbytes() == 8, dir,
                 "/optimizer.safetensors: \"step\" must be one I64");
      std::memcpy(&count, opt->bytes("step").data(), sizeof(count));
    }
    optimizer_->set_step_count(count);
    auto has = [&](const std::string& name) { return sharded ? shards->contains(name) : opt->contains(name); };
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string m = params[i]->name + ".exp_avg", v = params[i]->name + ".exp_avg_sq";
      LOOM_CHECK(has(m) == has(v), dir, " has only one of ", m, " and ", v);
      if (!has(m)) {  // a parameter that was never updated: zero moments
        for (Tensor* t : {&optimizer_->exp_avg(i), &optimizer_->exp_avg_sq(i)}) {
          if (t->defined()) t->zero_();
        }
        continue;
      }
      // Under a pipe axis: another stage's parameter, not held here, nor its moments.
      if (dist_ && !params[i]->pipe_stages.empty() && params[i]->value.numel() == 0) continue;
      Tensor tm = sharded ? shards->whole(m) : opt->tensor(m), tv = sharded ? shards->whole(v) : opt->tensor(v);
      if (dist_ && tm.shape() == params[i]->global_shape && tv.shape() == params[i]->global_shape &&
          tm.dtype() == DType::F32 && tv.dtype() == DType::F32) {  // whole moments: keep this rank's block
        const dist::Shard& shard = layout_[i].shards[static_cast<size_t>(dist_->rank)];
        tm = dist::copy_block(tm, shard);
        tv = dist::copy_block(tv, shard);
      }
      LOOM_CHECK(tm.shape() == params[i]->value.shape() && tv.shape() == params[i]->value.shape() &&
                     tm.dtype() == DType::F32 && tv.dtype() == DType::F32,
                 dir, "/optimizer.safetensors: ", m, " / ", v, " must be F32 ", params[i]->value.shape(), ", got ",
                 tm.shape(), " and ", tv.shape());
      // Copied into the optimizer's own buffers (never aliasing the file mapping).
      for (auto [dst, src] : {std::pair<Tensor*, Tensor*>{&optimizer_->exp_avg(i), &tm}, {&optimizer_->exp_avg_sq(i), &tv}}) {
        if (dst->defined()) {
          dst->copy_from(*src);
        } else {
          *dst = src->to(params[i]->value.device());  // beside the parameter (a copy: never the file mapping)
          if (dst->device().is_cpu()) *dst = dst->clone();
        }
      }
    }

    data_->train.restore(s.at("data_loader").get<data::LoaderState>());
    step_ = s.at("step").get<int64_t>();
    skipped_ = s.at("skipped").get<int64_t>();
    LOOM_CHECK(count == s.at("optimizer_steps").get<int64_t>(), dir, ": optimizer step ", count,
               " disagrees with trainer_state.json's ", s.at("optimizer_steps").get<int64_t>());
    last_train_event_ = s.at("last_train");
    first_val_loss_.reset();
    last_val_loss_.reset();
    last_val_step_ = -1;
    if (!s.at("first_val_loss").is_null()) first_val_loss_ = s.at("first_val_loss").get<double>();
    if (!s.at("last_val").is_null()) {
      last_val_loss_ = s.at("last_val").at("val_loss").get<double>();
      last_val_step_ = s.at("last_val").at("step").get<int64_t>();
    }
    val_pending_ = s.value("val_pending", false);  // absent in checkpoints from before it existed
    best_checkpoint_step_.reset();
    if (!s.at("best_checkpoint").is_null()) {
      best_checkpoint_step_ = s.at("best_checkpoint").at("step").get<int64_t>();
      best_checkpoint_val_ = s.at("best_checkpoint").at("val_loss").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL(state_path, ": malformed trainer state: ", e.what());
  }
}

Tensor Trainer::local(const Tensor& batch_tensor) const {
  if (dist_) return dist::local_batch(batch_tensor, *dist_);
  return device_.is_cpu() ? batch_tensor : batch_tensor.to(device_);  // the batch is read on the host
}

double Trainer::global(double local_loss) const { return dist_ ? dist::global_loss(local_loss, *dist_) : local_loss; }

void Trainer::finish_gradients() {
  if (dist_) dist::finish_gradients(model_->parameters(), *dist_);
  if (pipelined()) dist::finish_pipe_gradients(model_->parameters(), *dist_);
}

double Trainer::clip_or_norm(const std::vector<Tensor>& grads) {
  const double clip = config_.optimizer.grad_clip;
  if (!dist_) return clip > 0 ? clip_grad_norm(grads, clip) : global_grad_norm(grads);
  auto params = model_->parameters();
  return clip > 0 ? dist::clip_grad_norm(params, layout_, *dist_, clip) : dist::global_grad_norm(params, layout_, *dist_);
}

bool Trainer::agreed(bool stop) const {
  if (!dist_) return stop;
  double any = stop ? 1.0 : 0.0;  // a signal reaches ranks at different moments: stop when any rank saw it
  dist_->comm->all_reduce_sum(&any, 1, dist_->comm->world());
  return any > 0;
}

std::vector<Tensor> Trainer::whole_parameters() {
  std::vector<Tensor> out;
  for (nn::Parameter* p : model_->parameters()) {
    out.push_back(dist_ ? dist::gather_whole(p->value, *p, *dist_) : p->value.detach());
  }
  return out;
}

void Trainer::save_weights(const std::string& path) {
  if (!dist_) return runs::save_model_weights(*model_, path);
  std::vector<Tensor> whole = whole_parameters();
  if (writes_files()) {
    io::NamedTensors tensors;
    auto params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back(params[i]->name, whole[i]);
    for (const auto& [name, t] : model_->state_tensors()) tensors.emplace_back(name, t);
    io::write_safetensors(path, tensors, {{"loom.model_config", model_->model_config().json().dump()}});
  }
  dist_->comm->barrier(dist_->comm->world());
}

std::optional<int64_t> Trainer::resume(
    const std::function<void(const std::string&, const std::string&)>& skipped) {
  resume_attempted_ = true;
  auto ref = runs::latest_valid_checkpoint(run_dir_, skipped);
  if (!ref) return std::nullopt;
  load_checkpoint(ref->path);
  return step_;
}

}  // namespace loom::train
