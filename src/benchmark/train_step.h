// `loom bench`: full training steps on synthetic tokens, and the FMA peak MFU is measured against.
//
// FLOPs per token follow PaLM (Chowdhery et al. 2022, appendix B): 6N + 12·L·d·T, with N the
// parameters that take part in matrix multiplies (all but lookup tables; the head counts, tied or not)
// and the second term the attention scores and values, counted for the full T×T square (models/stats.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "models/model_config.h"

namespace loom::bench {

struct TrainBenchOptions {
  int64_t batch_size = 8;
  int64_t steps = 10;
  int64_t warmup_steps = 2;  // untimed, so the caches and oneDNN primitives are warm
  int threads = 0;           // 0: loom::num_threads()
  uint64_t seed = 0;
  bool bf16 = false;         // mixed-precision GEMMs (bf16 operands, f32 accumulation and weights)
  // cpu, or cuda:N: the model's parameters, the batch and the optimizer state on that GPU; the peak is
  // then the GPU's measured matrix rate (cuBLASLt, 8192^3, f32 or bf16 as the step's GEMMs) and the
  // memory the caching device allocator's peak.
  Device device = Device::cpu();
};

struct TrainBenchResult {
  int64_t params = 0;
  double flops_per_token = 0;
  double tokens_per_s = 0;
  double ms_per_step = 0;
  double gflops = 0;       // achieved model FLOP/s
  double peak_gflops = 0;  // measured FMA peak on the same threads (on a GPU: its measured GEMM rate)
  double mfu = 0;          // gflops / peak_gflops
  double final_loss = 0;
  // Memory, in MiB (-1 where /proc/self/status cannot be read). RSS counts everything the process
  // touched: code, libraries, OpenMP/oneDNN state, the allocator's cached blocks, as PyTorch's does.
  double start_rss_mib = 0;    // VmRSS when bench_train starts: the process before the model exists
  double peak_rss_mib = 0;     // VmHWM after the timed steps: the process's peak, warm-up steps included
  double tensor_peak_mib = 0;  // the CPU allocator's peak bytes in use (weights, gradients, moments,
                               // activations alive at once), over the model's build and all steps
  int threads = 0;
  std::string precision = "f32";
  std::string device = "cpu";
  double device_peak_mib = -1;  // on a GPU: the caching allocator's peak bytes allocated, in MiB
  // On a GPU: one extra step profiled op by op (a wait on the device at each op boundary), ms per op name
  // (forward + backward), plus "clip + AdamW" and the backward engine's glue.
  std::map<std::string, double> profile_ms;
  // The GEMM implementation that ran the model's square projections ([B*T, W] x [W, W], W = heads x
  // head width) in this precision: which oneDNN kernel, or loom's blocked kernel (backends/cpu/gemm.h).
  std::string gemm;
  std::string to_json() const;
};

TrainBenchResult bench_train(const models::ModelConfig& config, const TrainBenchOptions& options);

}  // namespace loom::bench
