// `loom bench peak` and `loom bench train`: one JSON line each, for the README's performance table.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backends/cpu/peak.h"
#include "cli/command.h"
#include "core/parallel.h"
#include "report/benchmark.h"
#include "train/config.h"
#include "train/memory.h"

namespace {

loom::cli::Register reg("bench", "Benchmarks: FMA peak, full training steps", [](CLI::App& cmd) {
  cmd.require_subcommand(1);

  auto* peak = cmd.add_subcommand("peak", "Measure the f32 FMA peak (the denominator of MFU)");
  static int peak_threads = 0;
  peak->add_option("--threads", peak_threads, "threads (default: all)");
  peak->callback([] {
    int threads = peak_threads > 0 ? peak_threads : loom::num_threads();
    auto r = loom::cpu::measure_fma_peak(threads, 1.0);
    nlohmann::json j = {{"peak_gflops", r.gflops}, {"threads", r.threads}, {"vector_bits", r.vector_bits}};
    std::printf("%s\n", j.dump().c_str());
  });

  auto* train = cmd.add_subcommand("train", "Time full training steps (forward, backward, clip, AdamW) on synthetic tokens");
  static std::string preset = "tiny";
  static std::vector<std::string> sets;
  static loom::report::TrainBenchOptions options;
  train->add_option("--preset", preset, "model preset or config file (tiny, default, cs336-tinystories, gpt2-small, ..., FILE.json)");
  train->add_option("--set", sets, "override a config key of the preset: --set model.context_length=256 (repeatable)");
  train->add_option("--batch", options.batch_size, "batch size");
  train->add_option("--steps", options.steps, "timed steps");
  train->add_option("--warmup", options.warmup_steps, "untimed steps first");
  train->add_option("--threads", options.threads, "threads (default: all)");
  train->add_flag("--bf16", options.bf16, "bf16 mixed-precision GEMMs (AMX), f32 master weights");
  static std::string max_memory;
  train->add_option("--max-memory", max_memory,
                    "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  train->callback([] {
    loom::models::ModelConfig model = loom::train::TrainConfig::load(preset, sets).model;
    loom::train::check_memory(loom::train::training_step_memory(model, options.batch_size, options.bf16, "--batch"),
                              loom::train::MemoryBudget::from_setting(max_memory), "bench train");
    auto r = loom::report::bench_train(model, options);
    std::printf("%s\n", r.to_json().c_str());
  });
});

}  // namespace
