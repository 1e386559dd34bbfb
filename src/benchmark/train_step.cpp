#include "benchmark/train_step.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "backends/cpu/gemm.h"
#include "backends/cpu/peak.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/runtime.h"
#include "core/caching_allocator.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "core/profile.h"
#include "models/model.h"
#include "models/stats.h"
#include "train/device.h"
#include "train/optimizer.h"

using loom::train::AdamW;
using loom::train::AdamWOptions;

namespace loom::bench {

namespace {

// A "Key:   N kB" line of /proc/self/status (VmRSS: resident now, VmHWM: the peak since exec), in MiB;
// -1 without procfs. The same source bench/pytorch_train.py reads, so the two columns compare.
double proc_status_mib(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double mib = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kib = 0;
    if (std::strncmp(line, key, n) == 0 && line[n] == ':' && std::sscanf(line + n + 1, "%lld", &kib) == 1) {
      mib = static_cast<double>(kib) / 1024.0;
      break;
    }
  }
  std::fclose(f);
  return mib;
}

}  // namespace

std::string TrainBenchResult::to_json() const {
  nlohmann::json j = {{"tokens_per_s", tokens_per_s}, {"ms_per_step", ms_per_step}, {"params", params},
                      {"flops_per_token", flops_per_token}, {"gflops", gflops}, {"peak_gflops", peak_gflops},
                      {"mfu", mfu}, {"start_rss_mib", start_rss_mib},
                      {"peak_rss_mib", peak_rss_mib}, {"tensor_peak_mib", tensor_peak_mib}, {"threads", threads}, {"precision", precision}, {"gemm", gemm}, {"final_loss", final_loss},
                      {"device", device}};
  if (device_peak_mib >= 0) j["device_peak_mib"] = device_peak_mib;
  if (!profile_ms.empty()) j["profile_ms"] = profile_ms;
  return j.dump();
}

TrainBenchResult bench_train(const models::ModelConfig& config, const TrainBenchOptions& options) {
  LOOM_CHECK(options.batch_size > 0, "bench: batch size must be positive, got ", options.batch_size);
  LOOM_CHECK(options.steps > 0, "bench: steps must be positive, got ", options.steps);
  LOOM_CHECK(options.warmup_steps >= 0, "bench: warm-up steps must be >= 0, got ", options.warmup_steps);
  set_num_threads(threads_or_default(options.threads, "bench: threads"));
  const int threads = num_threads();
  const double start_rss_mib = proc_status_mib("VmRSS");
  Allocator& allocator = allocator_for(Device::cpu());
  allocator.reset_peak();

  const Device device = options.device;
  const bool on_gpu = device.is_cuda();
  if (on_gpu) {
    cuda::check_device("bench train", device);
    cuda::caching_allocator(device.index()).reset_peak();
  }

  std::unique_ptr<models::LanguageModel> built = config.build(options.seed);
  models::LanguageModel& model = *built;
  train::move_to_device(model, device);  // built on the host (the same initial values), then moved over
  if (options.bf16) model.set_matmul_precision(ops::MatmulPrecision::BF16);
  AdamW optimizer(model.parameters(), AdamWOptions{.lr = 1e-3f, .weight_decay = 0.1f});
  const int64_t B = options.batch_size, T = config.context_length();
  // Synthetic tokens: targets are the next token of a random stream, so the loss can fall.
  Tensor stream = Tensor::empty({B * (T + 1)}, DType::I32);
  RngKey key = RngKey::from_seed(options.seed).fold_in("bench-data");
  for (int64_t i = 0; i < stream.numel(); ++i) {
    stream.data<int32_t>()[i] = static_cast<int32_t>(random_bits(key, static_cast<uint64_t>(i)) %
                                                     static_cast<uint32_t>(config.vocab_size()));
  }
  Tensor ids = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      ids.data<int32_t>()[b * T + t] = stream.data<int32_t>()[b * (T + 1) + t];
      targets.data<int32_t>()[b * T + t] = stream.data<int32_t>()[b * (T + 1) + t + 1];
    }
  }

  if (on_gpu) {
    ids = ids.to(device);
    targets = targets.to(device);
  }

  double loss_value = 0;
  std::map<std::string, double> gpu_profile_ms;
  // A training step as the trainer runs it: dropout (when the model has any) on, keyed by the step.
  const RngKey dropout_key = RngKey::from_seed(options.seed).fold_in("dropout");
  int64_t step_index = 0;
  auto step = [&] {
    optimizer.zero_grad();
    Tensor loss = model.loss(ids, targets, models::ForwardContext::train(dropout_key.fold_in(static_cast<uint64_t>(step_index++))));
    loss.backward();
    train::clip_grad_norm(train::gradients_of(model.parameters()), 1.0);
    optimizer.step();
    loss_value = loss.to(Device::cpu()).item();  // on a GPU this read waits for the step to finish
  };
  for (int64_t i = 0; i < options.warmup_steps; ++i) step();
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.steps; ++i) step();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (on_gpu) {
    // One more step, profiled with a wait on the GPU at every op boundary, so each op is charged its own
    // kernels: where a GPU step's time goes, by op (forward + backward), and the optimizer's share.
    profile::Profile prof;
    prof.wait = [device] { cuda::synchronize(device, "bench: profile"); };
    {
      profile::ProfileScope scope(prof);
      optimizer.zero_grad();
      prof.mark();
      Tensor loss = model.loss(ids, targets, models::ForwardContext::train(dropout_key.fold_in(static_cast<uint64_t>(step_index++))));
      loss.backward();
      const double t0 = prof.stamp();
      train::clip_grad_norm(train::gradients_of(model.parameters()), 1.0);
      optimizer.step();
      prof.add_region("clip + AdamW", prof.stamp() - t0);
    }
    for (const profile::OpRecord& op : prof.ops) {
      gpu_profile_ms[op.name] += 1e3 * (op.forward_seconds + op.backward_seconds);
    }
    for (const auto& [name, seconds] : prof.regions) gpu_profile_ms[name] += 1e3 * seconds;
    gpu_profile_ms["backward glue"] += 1e3 * prof.backward_glue_seconds;
  }
  const double peak_rss_mib = proc_status_mib("VmHWM");  // before the FMA peak's own buffers
  const double tensor_peak_mib = static_cast<double>(allocator.stats().peak_bytes_in_use) / (1024.0 * 1024.0);
  const double device_peak_mib =
      on_gpu ? static_cast<double>(cuda::caching_allocator(device.index()).stats().peak_allocated_bytes) / (1024.0 * 1024.0)
             : -1.0;

  TrainBenchResult r;
  r.threads = threads;
  r.precision = options.bf16 ? "bf16" : "f32";
  const models::ModelStats stats = config.stats();
  r.params = stats.total_params;
  r.flops_per_token = stats.palm_flops_per_token();
  r.ms_per_step = seconds * 1e3 / static_cast<double>(options.steps);
  r.tokens_per_s = static_cast<double>(B * T * options.steps) / seconds;
  r.gflops = r.tokens_per_s * r.flops_per_token / 1e9;
  r.device = str(device);
  r.device_peak_mib = device_peak_mib;
  r.profile_ms = gpu_profile_ms;
  r.peak_gflops = on_gpu ? train::gpu_matrix_peak_flops(device, options.bf16) / 1e9 : cpu::measure_fma_peak(threads).gflops;
  r.mfu = r.gflops / r.peak_gflops;
  r.final_loss = loss_value;
  r.start_rss_mib = start_rss_mib;
  r.peak_rss_mib = peak_rss_mib;
  r.tensor_peak_mib = tensor_peak_mib;
  const int64_t width = std::max<int64_t>(stats.attention_width, 1);
  r.gemm = on_gpu ? std::string("cuBLASLt") : cpu::gemm_implementation(false, true, B * T, width, width, options.bf16 ? DType::BF16 : DType::F32);
  return r;
}

}  // namespace loom::bench
