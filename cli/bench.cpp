// `loom bench peak`, `train`, `bandwidth` and `qmatmul`: one JSON line each, for the README's performance
// table and docs/quant.md. `loom bench roofline`: a per-op-family table and roofline.svg (docs/roofline.md).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backends/cpu/peak.h"
#include "cli/command.h"
#include "core/parallel.h"
#include "benchmark/bandwidth.h"
#include "benchmark/train_step.h"
#include "benchmark/roofline.h"
#include "train/config.h"
#include "runs/memory.h"

namespace {

loom::cli::Register reg("bench", "Benchmarks: FMA peak, full training steps, memory bandwidth, quantized matmul", [](CLI::App& cmd) {
  cmd.require_subcommand(1);

  auto* peak = cmd.add_subcommand("peak", "Measure the f32 FMA peak (the denominator of MFU)");
  static int peak_threads = 0;
  peak->add_option("--threads", peak_threads, "threads (default: all)");
  peak->callback([] {
    const int threads = loom::threads_or_default(peak_threads, "bench peak: --threads");
    auto r = loom::cpu::measure_fma_peak(threads, 1.0);
    nlohmann::json j = {{"peak_gflops", r.gflops}, {"threads", r.threads}, {"vector_bits", r.vector_bits}};
    std::printf("%s\n", j.dump().c_str());
  });

  auto* bw = cmd.add_subcommand("bandwidth", "Measure the memory read bandwidth (a streaming sum over a 1 GiB buffer)");
  static int bw_threads = 0;
  static int64_t bw_mib = 1024;
  bw->add_option("--threads", bw_threads, "threads (default: all)");
  loom::cli::in_range(bw->add_option("--mib", bw_mib, "buffer size in MiB (default 1024)"), 1, 1 << 20);
  bw->callback([] {
    const int threads = loom::threads_or_default(bw_threads, "bench bandwidth: --threads");
    std::printf("%s\n", loom::bench::measure_read_bandwidth(threads, bw_mib << 20).to_json().c_str());
  });

  auto* qm = cmd.add_subcommand("qmatmul", "Time y = x W^T with quantized (or f32) weights read from DRAM");
  static std::string qm_type = "Q4_1", qm_path = "auto";
  static int64_t qm_m = 1, qm_n = 1536, qm_k = 576;
  static int qm_threads = 0, qm_calls = 50;
  qm->add_option("--type", qm_type, "weight type: Q4_1, Q4_0, Q8_0, Q4_K, Q6_K or f32 (oneDNN)");
  loom::cli::in_range(qm->add_option("-m", qm_m, "rows of x (1: decode)"), 1, 65536);
  loom::cli::in_range(qm->add_option("-n", qm_n, "rows of W (out features)"), 1, 65536);
  loom::cli::in_range(qm->add_option("-k", qm_k, "columns of W (in features)"), 32, 65536);
  qm->add_option("--path", qm_path, "kernels: auto, scalar, avx2, avx512-vnni, amx");
  qm->add_option("--threads", qm_threads, "threads (default: all)");
  loom::cli::in_range(qm->add_option("--calls", qm_calls, "timed calls (their median is reported)"), 1, 1000000);
  qm->callback([] {
    loom::quant::KernelPath path = loom::quant::KernelPath::Auto;
    bool known = qm_path == "auto";
    for (auto p : {loom::quant::KernelPath::Scalar, loom::quant::KernelPath::Avx2, loom::quant::KernelPath::Avx512Vnni,
                   loom::quant::KernelPath::Amx}) {
      if (qm_path == loom::quant::kernel_path_name(p)) path = p, known = true;
    }
    if (!known) throw loom::Error("--path " + qm_path + ": expected auto, scalar, avx2, avx512-vnni or amx");
    const int threads = loom::threads_or_default(qm_threads, "bench qmatmul: --threads");
    auto r = loom::bench::bench_quantized_matmul(qm_type, qm_m, qm_n, qm_k, path, threads, qm_calls);
    std::printf("%s\n", r.to_json().c_str());
  });

  auto* dec = cmd.add_subcommand("decode",
                                 "Time prefill and KV-cache decoding of a synthetic Llama (SmolLM2-135M's shape by "
                                 "default) with f32 or quantized weights");
  static loom::bench::DecodeBenchOptions dec_options;
  dec->add_option("--weights", dec_options.weights, "Linear weights: f32, Q8_0, Q4_0 or Q4_1 (default Q4_1)");
  dec->add_option("--head", dec_options.head, "lm_head with quantized weights: f32, Q8_0, Q4_0 or Q4_1 (default Q8_0)");
  loom::cli::in_range(dec->add_option("--prompt-tokens", dec_options.prompt_tokens, "prefill length (default 4)"), 1, 1 << 20);
  loom::cli::in_range(dec->add_option("--new-tokens", dec_options.new_tokens, "decoded tokens (default 64)"), 1, 1 << 20);
  dec->add_option("--threads", dec_options.threads, "threads (default: all)");
  loom::cli::in_range(dec->add_option("--repeats", dec_options.repeats, "runs; the best is reported (default 3)"), 1, 1000);
  loom::cli::in_range(dec->add_option("--layers", dec_options.num_layers, "layers (default 30)"), 1, 1000);
  loom::cli::in_range(dec->add_option("--vocab", dec_options.vocab_size, "vocabulary (default 49152)"), 1, 1 << 22);
  loom::cli::in_file(dec->add_option("--gguf", dec_options.gguf, "time this Llama GGUF file (matrices kept quantized) instead of a synthetic model"), "gguf");
  dec->add_flag("!--unfused", dec_options.fused,
                "decode op by op (one parallel region per op) instead of the fused quantized step");
  dec->callback([] { std::printf("%s\n", loom::bench::bench_decode(dec_options).to_json().c_str()); });

  auto* train = cmd.add_subcommand("train", "Time full training steps (forward, backward, clip, AdamW) on synthetic tokens");
  static std::string preset = "tiny";
  static std::vector<std::string> sets;
  static loom::bench::TrainBenchOptions options;
  loom::cli::in_file(train->add_option("--preset", preset, "model preset or config file (tiny, default, cs336-tinystories, gpt2-small, ..., FILE.json)"), "config")
      ->type_name("PRESET|FILE");
  train->add_option("--set", sets, "override a config key of the preset: --set model.context_length=256 (repeatable)");
  loom::cli::in_range(train->add_option("--batch", options.batch_size, "batch size"), 1, 1 << 30);  // the memory check refuses what cannot fit
  loom::cli::in_range(train->add_option("--steps", options.steps, "timed steps"), 1, 1000000);
  loom::cli::in_range(train->add_option("--warmup", options.warmup_steps, "untimed steps first"), 0, 1000000);
  train->add_option("--threads", options.threads, "threads (default: all)");
  train->add_flag("--bf16", options.bf16, "bf16 mixed-precision GEMMs (AMX), f32 master weights");
  static std::string train_device = "cpu";
  train->add_option("--device", train_device, "cpu, cuda or cuda:N: time the steps on that GPU (docs/cuda.md)");
  static std::string max_memory;
  train->add_option("--max-memory", max_memory,
                    "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  train->callback([] {
    loom::models::ModelConfig model = loom::train::TrainConfig::load(preset, sets).model;
    try {
      options.device = loom::Device::parse(train_device);
    } catch (const loom::Error& e) {
      LOOM_FAIL("bench train: --device: ", e.what());
    }
    if (options.device.is_cpu()) {  // the host's memory; a GPU's caching allocator names what it lacks
      loom::runs::check_memory(loom::runs::training_step_memory(model, options.batch_size, options.bf16, "--batch"),
                                loom::runs::MemoryBudget::from_setting(max_memory), "bench train");
    }
    auto r = loom::bench::bench_train(model, options);
    std::printf("%s\n", r.to_json().c_str());
  });

  auto* roof = cmd.add_subcommand("roofline",
                                  "Profile a training step per op family against the machine's FMA peak and memory "
                                  "bandwidth; print a table and write roofline.svg");
  static std::string roof_preset = "tiny", roof_out = ".";
  static std::vector<std::string> roof_sets;
  static loom::bench::RooflineOptions roof_options;
  loom::cli::in_file(roof->add_option("--preset", roof_preset, "model preset or config file (tiny, cs336-tinystories, gpt2-small, ..., FILE.json)"), "config")
      ->type_name("PRESET|FILE");
  roof->add_option("--set", roof_sets, "override a config key of the preset (repeatable)");
  loom::cli::in_range(roof->add_option("--batch", roof_options.batch_size, "batch size (default 8)"), 1, 1 << 30);
  loom::cli::in_range(roof->add_option("--steps", roof_options.steps, "profiled steps (default 3)"), 1, 1000000);
  loom::cli::in_range(roof->add_option("--warmup", roof_options.warmup_steps, "untimed steps first (default 1)"), 0, 1000000);
  roof->add_option("--threads", roof_options.threads, "threads (default: all)");
  roof->add_flag("--bf16", roof_options.bf16, "bf16 mixed-precision GEMMs, as bench train --bf16");
  loom::cli::in_range(roof->add_option("--bandwidth-mib", roof_options.bandwidth_mib, "buffer for the bandwidth measurement (default 512)"), 1, 1 << 20);
  loom::cli::out_dir(roof->add_option("--out", roof_out, "folder for roofline.svg and roofline.json (default: .)"), "roofline");
  roof->callback([] {
    loom::models::ModelConfig model = loom::train::TrainConfig::load(roof_preset, roof_sets).model;
    loom::runs::check_memory(loom::runs::training_step_memory(model, roof_options.batch_size, roof_options.bf16, "--batch"),
                              loom::runs::MemoryBudget::from_setting(""), "bench roofline");
    auto r = loom::bench::bench_roofline(model, roof_options);
    const auto paths = r.write(roof_out);
    std::printf("%s", r.table().c_str());
    std::printf("wrote %s and %s\n", paths[0].c_str(), paths[1].c_str());
  });
});

}  // namespace
