#include "report/flops.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backends/cpu/peak.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/progress.h"

namespace loom::report {


FlopsReport flops_report(const train::TrainConfig& config, std::optional<double> tokens_per_s,
                         std::optional<double> peak_flops, std::optional<int64_t> tokens) {
  FlopsReport r;
  r.arch = config.model.arch();
  r.stats = config.model.stats();
  r.palm_per_token = r.stats.palm_flops_per_token();
  r.chinchilla_per_token = r.stats.chinchilla_flops_per_token();
  r.chinchilla_optimal_tokens = models::chinchilla_optimal_tokens(r.stats.total_params);
  r.run_tokens = tokens ? *tokens : config.training.max_steps * config.tokens_per_step();
  r.run_flops = static_cast<double>(r.run_tokens) * r.palm_per_token;
  r.run_flops_chinchilla = models::chinchilla_train_flops_exact(r.stats, r.run_tokens);
  r.peak_flops = peak_flops                          ? *peak_flops
                 : config.logging.peak_flops > 0 ? config.logging.peak_flops
                                                 : train::estimate_cpu_peak_flops(static_cast<int>(config.training.threads));
  if (tokens_per_s && *tokens_per_s > 0) {
    r.tokens_per_s = tokens_per_s;
    r.mfu = train::mfu(r.palm_per_token, *tokens_per_s, r.peak_flops);
    r.run_seconds = static_cast<double>(r.run_tokens) / *tokens_per_s;
    r.chinchilla_optimal_seconds = r.chinchilla_optimal_tokens / *tokens_per_s;
  }
  return r;
}

std::string with_commas(const std::string& digits) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

namespace {
std::string si(double v) {
  char buf[32];
  const char* units[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (v >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f%s" : "%.2f%s", v, units[u]);
  return buf;
}
std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", v);
  return buf;
}
}  // namespace

std::string format_flops_report(const FlopsReport& r) {
  const models::ModelStats& m = r.stats;
  const double L = static_cast<double>(m.num_layers), T = static_cast<double>(m.context_length);
  std::ostringstream o;
  o << "model: " << r.arch << " " << m.description << "\n";
  o << "parameters: " << with_commas(std::to_string(m.total_params)) << " total ("
    << si(static_cast<double>(m.total_params)) << "), " << with_commas(std::to_string(m.matmul_params))
    << " in matrix multiplies (" << si(static_cast<double>(m.matmul_params)) << ")\n";
  if (m.active_params > 0) {
    o << "parameters used per token: " << with_commas(std::to_string(m.active_params)) << " ("
      << si(static_cast<double>(m.active_params)) << "; the FLOPs below count these"
      << (m.training_modules > 0 ? ", and the training-only modules" : "") << ")\n";
  }
  o << "training FLOPs per token:\n";
  o << "  6N + 12*L*d*T (PaLM, N in matmuls):  " << sci(r.palm_per_token) << "  (6N "
    << sci(6.0 * static_cast<double>(m.matmul_params)) << " + attention "
    << sci(12.0 * L * static_cast<double>(m.attention_width) * T);
  if (m.training_modules > 0) {
    o << " + training-only modules " << sci(m.training_module_flops_per_token_at(T)) << ": " << m.training_modules
      << " x " << with_commas(std::to_string(m.training_module_matmul_params))
      << " weights and an attention layer, at T - k positions";
  }
  o << ")\n";
  const auto& c = m.chinchilla;
  o << "  Chinchilla appendix F (3 x forward): " << sci(r.chinchilla_per_token) << "  (" << m.chinchilla_note
    << ")\n";
  o << "    forward per token: embeddings " << sci(c.embeddings / T) << ", attention " << sci(L * c.attention() / T)
    << ", dense " << sci(L * c.dense / T) << ", logits " << sci(c.logits / T) << "\n";
  o << "decoding cache: " << m.kv_cache_floats_per_token << " numbers per token (all layers"
    << (m.kv_cache_note.empty() ? "" : "; " + m.kv_cache_note) << ")\n";
  o << "Chinchilla-optimal tokens (20 per parameter): "
    << with_commas(std::to_string(static_cast<int64_t>(r.chinchilla_optimal_tokens))) << " ("
    << si(r.chinchilla_optimal_tokens) << ")\n";
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.3g",
                r.chinchilla_optimal_tokens > 0 ? static_cast<double>(r.run_tokens) / r.chinchilla_optimal_tokens : 0);
  o << "this run: " << with_commas(std::to_string(r.run_tokens)) << " tokens (" << ratio
    << " x Chinchilla-optimal)\n";
  o << "  training FLOPs, Chinchilla appendix F: " << with_commas(r.run_flops_chinchilla) << "\n";
  o << "  training FLOPs, 6N + attention:        " << sci(r.run_flops) << "\n";
  if (r.tokens_per_s) {
    o << "at " << si(*r.tokens_per_s) << " tokens/s: this run " << train::format_duration(*r.run_seconds)
      << ", Chinchilla-optimal " << train::format_duration(*r.chinchilla_optimal_seconds) << "; "
      << sci(*r.tokens_per_s * r.palm_per_token) << " FLOP/s achieved";
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", MFU %.1f%% of ", 100.0 * r.mfu.value_or(0));
    o << buf << sci(r.peak_flops) << " FLOP/s peak\n";
  } else {
    o << "(give --tokens-per-s or --run DIR for time estimates)\n";
  }
  return o.str();
}

nlohmann::json to_json(const FlopsReport& r) {
  nlohmann::json j{{"arch", r.arch},
                   {"total_params", r.stats.total_params},
                   {"matmul_params", r.stats.matmul_params},
                   {"kv_cache_floats_per_token", r.stats.kv_cache_floats_per_token},
                   {"active_params", r.stats.active_params > 0 ? r.stats.active_params : r.stats.total_params},
                   {"run_flops_chinchilla", r.run_flops_chinchilla},
                   {"palm_flops_per_token", r.palm_per_token},
                   {"chinchilla_flops_per_token", r.chinchilla_per_token},
                   {"chinchilla_optimal_tokens", r.chinchilla_optimal_tokens},
                   {"run_tokens", r.run_tokens},
                   {"run_flops", r.run_flops}};
  if (r.tokens_per_s) {
    j["tokens_per_s"] = *r.tokens_per_s;
    j["run_seconds"] = *r.run_seconds;
    j["chinchilla_optimal_seconds"] = *r.chinchilla_optimal_seconds;
    j["mfu"] = r.mfu.value_or(0);
  }
  j["peak_flops"] = r.peak_flops;
  return j;
}

std::string run_config_file(const std::string& run_dir) {
  const std::filesystem::path p = std::filesystem::path(run_dir) / "config.json";
  return std::filesystem::exists(p) ? p.string() : "";
}

double run_tokens_per_s(const std::string& run_dir) {
  const auto tps = train::median_tokens_per_s(train::read_metrics((std::filesystem::path(run_dir) / "metrics.jsonl").string()));
  LOOM_CHECK(tps.has_value(), "flops: ", run_dir, "/metrics.jsonl has no train events with tokens_per_s");
  return *tps;
}

double measured_peak_flops(const train::TrainConfig& config) {
  const int threads = config.training.threads > 0 ? static_cast<int>(config.training.threads) : num_threads();
  return cpu::measure_fma_peak(threads).gflops * 1e9;
}

}  // namespace loom::report
