// `loom flops`: parameters, training FLOPs per token, the Chinchilla-optimal token count, and time
// estimates, for any family (the formulas per family: models/stats.h and Family::stats).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "models/stats.h"
#include "train/progress.h"

namespace loom::train {
struct TrainConfig;
}

namespace loom::report {

struct FlopsReport {
  std::string arch;
  models::ModelStats stats;
  double palm_per_token = 0;
  double chinchilla_per_token = 0;
  double chinchilla_optimal_tokens = 0;
  int64_t run_tokens = 0;          // --tokens, or max_steps × tokens_per_step
  double run_flops = 0;            // run_tokens × palm_per_token
  std::string run_flops_chinchilla;  // exact integer: 3 × forward per sequence × run_tokens / T
  std::optional<double> tokens_per_s;
  std::optional<double> run_seconds;                 // run_tokens / tokens_per_s
  std::optional<double> chinchilla_optimal_seconds;  // optimal tokens / tokens_per_s
  double peak_flops = 0;                              // logging.peak_flops, or the CPU estimate
  std::optional<double> mfu;                          // at tokens_per_s, PaLM FLOPs over peak_flops
};

// peak_flops: the MFU denominator; when absent, logging.peak_flops or else estimate_cpu_peak_flops.
// tokens: the run's training tokens; when absent, max_steps × tokens_per_step.
FlopsReport flops_report(const train::TrainConfig& config, std::optional<double> tokens_per_s = std::nullopt,
                         std::optional<double> peak_flops = std::nullopt, std::optional<int64_t> tokens = std::nullopt);
std::string format_flops_report(const FlopsReport& r);
nlohmann::json to_json(const FlopsReport& r);

// What `loom flops --run DIR` takes from a run directory: its config file (DIR/config.json; "" when
// it has none), and the median training throughput of DIR/metrics.jsonl (loom::Error naming the file
// when it has no train events with tokens_per_s).
std::string run_config_file(const std::string& run_dir);
double run_tokens_per_s(const std::string& run_dir);
// The CPU's measured f32 FMA peak, in FLOP/s, on the threads the config trains with (training.threads,
// else all): the MFU denominator of `loom flops --measure-peak` (0.5 s of measuring).
double measured_peak_flops(const train::TrainConfig& config);

// 1234567 -> "1,234,567".
std::string with_commas(const std::string& digits);

}  // namespace loom::report
