// `loom flops --config C`: parameters, training FLOPs per token (PaLM's 6N + attention and Chinchilla's
// appendix F), the Chinchilla-optimal token count, and time estimates at a measured throughput.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "report/flops.h"
#include "train/config.h"

namespace {
struct Options {
  std::string config = "default";
  std::vector<std::string> overrides;
  double tokens_per_s = 0;
  int64_t tokens = 0;
  std::string run;
  bool json = false;
  bool measure_peak = false;
};

loom::cli::Register reg("flops", "Parameters, FLOPs per token and compute-optimal estimates for a config",
                        [](CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  CLI::Option* config_opt =
      loom::cli::in_file(cmd.add_option("--config", o->config, "preset name or config file (with --run: the run's config.json)"),
                         "config")
          ->type_name("PRESET|FILE")
          ->capture_default_str();
  cmd.add_option("--set", o->overrides, "override a config value: section.key=value (repeatable)");
  cmd.add_option("--tokens-per-s", o->tokens_per_s, "measured training throughput");
  cmd.add_option("--tokens", o->tokens, "training tokens to count (default: max_steps x tokens per step)");
  loom::cli::in_dir(cmd.add_option("--run", o->run, "take the config and the median throughput from this run directory"), "run");
  cmd.add_flag("--json", o->json, "print one JSON object");
  cmd.add_flag("--measure-peak", o->measure_peak,
               "measure the CPU's FMA peak for MFU (0.5 s) instead of estimating it from /proc/cpuinfo");
  cmd.callback([o, config_opt] {
    std::string config = o->config;
    std::optional<double> tps;
    if (o->tokens_per_s > 0) tps = o->tokens_per_s;
    if (!o->run.empty()) {
      if (const std::string saved = loom::report::run_config_file(o->run); config_opt->count() == 0 && !saved.empty()) {
        config = saved;
      }
      if (!tps) tps = loom::report::run_tokens_per_s(o->run);
    }
    auto cfg = loom::train::TrainConfig::load(config, o->overrides);
    std::optional<double> peak;
    if (o->measure_peak) peak = loom::report::measured_peak_flops(cfg);
    LOOM_CHECK(o->tokens >= 0, "flops: --tokens must be >= 0, got ", o->tokens);
    auto report = loom::report::flops_report(cfg, tps, peak, o->tokens > 0 ? std::optional<int64_t>(o->tokens) : std::nullopt);
    if (o->json) {
      std::printf("%s\n", loom::report::to_json(report).dump().c_str());
    } else {
      std::printf("config: %s\n%s", config.c_str(), loom::report::format_flops_report(report).c_str());
    }
  });
});
}  // namespace
