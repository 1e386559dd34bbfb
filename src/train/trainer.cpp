#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "backends/cpu/peak.h"
#include "core/autograd.h"
#include "core/parallel.h"
#include "data/batch.h"
#include "ops/elementwise.h"
#include "train/flops.h"
#include "train/metrics.h"
#include "train/progress.h"

namespace loom::train {

struct Trainer::Data {
  data::BatchLoader train;
  std::vector<data::Batch> val;
};

namespace {

data::TokenFile open_tokens(const std::string& path, const char* key, int64_t vocab_size) {
  LOOM_CHECK(std::filesystem::exists(path), "config: ", key, " = \"", path, "\" does not exist");
  data::TokenFile file = data::TokenFile::open(path);
  LOOM_CHECK(file.max_token() < static_cast<uint64_t>(vocab_size), "config: ", key, " = \"", path,
             "\" holds token id ", file.max_token(), ", but model.vocab_size is ", vocab_size);
  return file;
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::string run_dir) : config_(std::move(config)), run_dir_(std::move(run_dir)) {
  config_.validate();
  if (config_.training.threads > 0) set_num_threads(static_cast<int>(config_.training.threads));
  data::TokenFile train = open_tokens(config_.data.train, "data.train", config_.model.vocab_size);
  data::TokenFile val = open_tokens(config_.data.val, "data.val", config_.model.vocab_size);
  config_.check_data_size(train.size(), val.size());

  const RngKey root = RngKey::from_seed(config_.training.seed);
  const int64_t B = config_.training.batch_size, T = config_.model.context_length;
  data::BatchLoader train_loader(train, B, T, config_.training.sampling, root.fold_in("train-batches"));
  data::BatchLoader val_loader(val, B, T, config_.training.sampling, root.fold_in("val-batches"));
  data_ = std::make_shared<Data>(Data{std::move(train_loader), val_loader.fixed_batches(config_.eval.batches)});

  model_ = std::make_unique<llama::TransformerLM>(config_.model, config_.training.seed);
  const auto& o = config_.optimizer;
  optimizer_ = std::make_unique<AdamW>(
      model_->parameters(), AdamWOptions{static_cast<float>(o.lr), static_cast<float>(o.beta1),
                                         static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                         static_cast<float>(o.weight_decay)});
}

double Trainer::validation_loss() {
  autograd::NoGradGuard no_grad;
  double total = 0;
  for (const data::Batch& b : data_->val) total += model_->loss(b.inputs, b.targets).item();
  return data_->val.empty() ? 0.0 : total / static_cast<double>(data_->val.size());
}

TrainSummary Trainer::run(const StopSignal* stop) {
  std::filesystem::create_directories(run_dir_);
  config_.write(run_dir_);
  const auto& tc = config_.training;
  const auto& oc = config_.optimizer;
  MetricsWriter metrics(run_dir_, step_ > 0 ? std::optional<int64_t>(step_) : std::nullopt);
  Progress progress(tc.max_steps, progress_mode_from_name(config_.logging.progress, stderr), stderr, step_);
  const double flops_per_token = palm_train_flops_per_token(config_.model);
  const double peak = config_.logging.peak_flops > 0 ? config_.logging.peak_flops
                                                      : cpu::measure_fma_peak(num_threads(), 0.3).gflops * 1e9;
  const int64_t tokens_per_step = config_.tokens_per_step();
  auto params = model_->parameters();

  TrainSummary summary;
  auto validate_now = [&] {
    double v = validation_loss();
    if (!summary.first_val_loss) summary.first_val_loss = v;
    summary.last_val_loss = v;
    ValEvent e{step_, v};
    metrics.val(e);
    progress.log_val(e);
  };
  if (step_ == 0 && config_.eval.interval > 0) validate_now();  // the starting point of the val curve

  using Clock = std::chrono::steady_clock;
  const auto run_start = Clock::now();
  auto window_start = run_start;
  int64_t window_steps = 0, run_steps = 0;
  while (step_ < tc.max_steps) {
    const float lr = cosine_lr(step_, static_cast<float>(oc.lr), static_cast<float>(oc.min_lr),
                               config_.schedule.warmup_steps, config_.cosine_steps());
    optimizer_->zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < tc.grad_accum_steps; ++micro) {
      data::Batch batch = data_->train.next();
      Tensor loss = model_->loss(batch.inputs, batch.targets);
      loss_sum += loss.item();
      // Mean over micro-batches: each contributes 1/accum of the gradient.
      (tc.grad_accum_steps > 1 ? ops::scale(loss, 1.0f / static_cast<float>(tc.grad_accum_steps)) : loss).backward();
    }
    const double loss_value = loss_sum / static_cast<double>(tc.grad_accum_steps);
    std::vector<Tensor> grads = gradients_of(params);
    if (after_backward) after_backward(step_, grads);
    const double grad_norm = oc.grad_clip > 0 ? clip_grad_norm(grads, oc.grad_clip) : global_grad_norm(grads);
    const bool finite = std::isfinite(loss_value) && std::isfinite(grad_norm);
    if (finite) {
      optimizer_->step(lr);
    } else {
      ++skipped_;
      metrics.write({{"event", "skip"}, {"step", step_ + 1}, {"loss", loss_value}, {"grad_norm", grad_norm},
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
      e.mfu = mfu(flops_per_token, e.tokens_per_s, peak);
      metrics.train(e);
      progress.log(e);
      window_start = Clock::now();
      window_steps = 0;
    }
    progress.update(step_);
    if (config_.eval.interval > 0 && (step_ % config_.eval.interval == 0 || step_ == tc.max_steps)) validate_now();
    if (stop != nullptr && stop->requested()) {
      summary.stopped_early = step_ < tc.max_steps;
      if (summary.stopped_early) progress.note(str("stopping after step ", step_, " (interrupted)"));
      break;
    }
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  summary.steps_completed = step_;
  summary.steps_skipped = skipped_;
  summary.tokens_per_s = run_steps > 0 ? static_cast<double>(run_steps * tokens_per_step) / seconds : 0.0;
  if (skipped_ > 0) progress.note(str(skipped_, " step(s) skipped for non-finite loss or gradient"));
  return summary;
}

}  // namespace loom::train
