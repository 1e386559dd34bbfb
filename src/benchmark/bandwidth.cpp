#include "benchmark/bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/gemm.h"
#include "core/autograd.h"
#include "models/gguf.h"
#include "models/llama/model.h"
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "runs/memory.h"
#include "runs/load.h"

namespace loom::bench {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (every thread), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Copies of the weights that together exceed any last-level cache, cycled through so that every call
// reads its weights from DRAM, as a decode step over all layers does (at most 256: a matrix small
// enough to need more is cache-resident in any real model too).
int64_t copies_for(int64_t weight_bytes) {
  constexpr int64_t kBeyondCaches = int64_t{512} << 20;
  return std::clamp<int64_t>((kBeyondCaches + weight_bytes - 1) / weight_bytes, 2, 256);
}

}  // namespace

BandwidthResult measure_read_bandwidth(int threads, int64_t bytes, int repeats) {
  LOOM_CHECK(threads >= 1, "measure_read_bandwidth: threads = ", threads, " must be >= 1");
  LOOM_CHECK(bytes >= (int64_t{1} << 20), "measure_read_bandwidth: buffer of ", bytes, " bytes is too small (>= 1 MiB)");
  const int64_t n = bytes / 4;
  std::vector<float> buf(static_cast<size_t>(n));
  // First touch from the reading threads, so each slice's pages sit near the thread that reads them.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<float>(i & 1023);
  double best = 1e30, sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now_seconds();
    double total = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
    for (int t = 0; t < threads; ++t) {
      const int64_t b = n * t / threads, e = n * (t + 1) / threads;
      // Four independent 8-float vector sums (GCC vector extensions: 256-bit loads and adds where the
      // ISA has them), so the loop is limited by the loads, not by the add latency. (A plain float loop
      // does not vectorise without -ffast-math and measured ~30% low.)
      typedef float v8f __attribute__((vector_size(32)));
      v8f acc[4] = {};
      const float* p = buf.data();
      int64_t i = b;
      for (; i + 32 <= e; i += 32) {
        for (int j = 0; j < 4; ++j) {
          v8f v;
          std::memcpy(&v, p + i + 8 * j, sizeof v);
          acc[j] += v;
        }
      }
      float tail = 0;
      for (; i < e; ++i) tail += p[i];
      const v8f sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      for (int j = 0; j < 8; ++j) total += sum[j];
      total += tail;
    }
    best = std::min(best, now_seconds() - t0);
    sink += total;
  }
  LOOM_ASSERT(sink != -1.0);  // keeps the sums alive
  return {static_cast<double>(n * 4) / best / 1e9, n * 4, threads};
}

QuantMatmulBenchResult bench_quantized_matmul(const std::string& type, int64_t M, int64_t N, int64_t K,
                                              quant::KernelPath path, int threads, int calls) {
  LOOM_CHECK(M >= 1 && N >= 1 && K >= 32 && calls >= 1, "bench_quantized_matmul: M=", M, " N=", N, " K=", K,
             " calls=", calls, " (M, N, calls >= 1; K >= 32)");
  const int saved = num_threads();
  set_num_threads(threads);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  for (float& v : w) v = normal(gen);
  for (float& v : x) v = normal(gen);
  QuantMatmulBenchResult r;
  r.type = type;
  r.M = M, r.N = N, r.K = K, r.threads = threads;
  std::vector<double> times;  // of the timed calls; each reads its weights from DRAM
  int64_t weight_bytes = 0;
  if (type == "f32" || type == "F32") {
    r.path = "onednn-f32";
    weight_bytes = N * K * 4;
    std::vector<std::vector<float>> copies(static_cast<size_t>(copies_for(weight_bytes)), w);
    for (int c = 0; c < calls + 3; ++c) {
      const float* wc = copies[static_cast<size_t>(c) % copies.size()].data();
      const double t0 = now_seconds();
      cpu::gemm(false, true, M, N, K, 1.0f, x.data(), K, wc, K, 0.0f, y.data(), N);
      if (c >= 3) times.push_back(now_seconds() - t0);
    }
  } else {
    quant::QuantType qt = quant::QuantType::F32;
    bool found = false;
    for (uint32_t id : {2u, 3u, 8u, 12u, 14u}) {
      if (type == quant::quant_type_name(static_cast<quant::QuantType>(id))) qt = static_cast<quant::QuantType>(id), found = true;
    }
    LOOM_CHECK(found, "bench: unknown weight type '", type, "' (expected f32, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K)");
    // K-quants have no quantizer here: random blocks with small scales are as fast to multiply.
    std::vector<uint8_t> bytes(static_cast<size_t>(N * quant::row_bytes(qt, K)));
    if (qt == quant::QuantType::Q4_K || qt == quant::QuantType::Q6_K) {
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(gen() & 0x3f);
    } else {
      quant::quantize(qt, w.data(), N * K, bytes.data());
    }
    r.path = quant::kernel_path_name(path == quant::KernelPath::Auto ? quant::best_kernel_path() : path);
    weight_bytes = static_cast<int64_t>(bytes.size());
    std::vector<quant::QuantizedMatrix> copies;
    for (int64_t i = 0; i < copies_for(weight_bytes); ++i) copies.emplace_back(qt, N, K, bytes.data());
    for (int c = 0; c < calls + 3; ++c) {
      const quant::QuantizedMatrix& q = copies[static_cast<size_t>(c) % copies.size()];
      const double t0 = now_seconds();
      quant::quantized_matmul(x.data(), M, q, y.data(), path);
      if (c >= 3) times.push_back(now_seconds() - t0);
    }
  }
  set_num_threads(saved);
  // The median: on a shared machine a call that loses its time slice would dominate a mean.
  std::sort(times.begin(), times.end());
  r.seconds = times[times.size() / 2];
  r.weight_gb_per_s = static_cast<double>(weight_bytes) / r.seconds / 1e9;
  r.gflops = 2.0 * static_cast<double>(M * N * K) / r.seconds / 1e9;
  return r;
}

namespace {

quant::QuantType weight_type(const std::string& name, const char* option) {
  for (uint32_t id : {2u, 3u, 8u}) {
    if (name == quant::quant_type_name(static_cast<quant::QuantType>(id))) return static_cast<quant::QuantType>(id);
  }
  LOOM_FAIL(option, " ", name, ": expected f32, Q8_0, Q4_0 or Q4_1");
}

void quantize_linear(nn::Linear& l, quant::QuantType type) {
  const Tensor& w = l.weight.value;
  l.set_quantized(std::make_shared<quant::QuantizedMatrix>(
      quant::QuantizedMatrix::quantize(type, w.data<float>(), w.size(0), w.size(1))));
}

}  // namespace

std::string BandwidthResult::to_json() const {
  return nlohmann::json{{"read_gb_per_s", gb_per_s}, {"bytes", bytes}, {"threads", threads}}.dump();
}

std::string QuantMatmulBenchResult::to_json() const {
  nlohmann::json j = {{"type", type}, {"path", path}, {"M", M}, {"N", N}, {"K", K},
                      {"us_per_call", seconds * 1e6}, {"weight_gb_per_s", weight_gb_per_s},
                      {"gflops", gflops}, {"threads", threads}};
  return j.dump();
}

std::string DecodeBenchResult::to_json() const {
  nlohmann::json j = {{"prefill_tok_per_s", prefill_tok_per_s}, {"decode_tok_per_s", decode_tok_per_s},
                      {"weight_bytes", weight_bytes}, {"decode_weight_gb_per_s", decode_weight_gb_per_s},
                      {"threads", threads}, {"parallel_regions_per_token", parallel_regions_per_token},
                      {"decode_cpu_ms_per_token", decode_cpu_ms_per_token}};
  return j.dump();
}

DecodeBenchResult bench_decode(const DecodeBenchOptions& o) {
  LOOM_CHECK(o.prompt_tokens >= 1 && o.new_tokens >= 1 && o.repeats >= 1, "bench decode: prompt_tokens=",
             o.prompt_tokens, ", new_tokens=", o.new_tokens, " and repeats=", o.repeats, " must be >= 1");
  const int saved = num_threads();
  const int threads = threads_or_default(o.threads, "bench decode: threads");
  set_num_threads(threads);
  std::unique_ptr<models::LanguageModel> loaded;
  std::unique_ptr<llama::TransformerLM> synthetic;
  DecodeBenchResult r;
  r.threads = threads;
  if (!o.gguf.empty()) {
    // load_weights reads a loom weights file too: bench decode --gguf times a GGUF's quantized matrices.
    LOOM_CHECK(models::is_gguf_file(o.gguf), "bench decode: --gguf ", o.gguf, " is not a GGUF file (no GGUF magic)");
    loaded = runs::load_weights(o.gguf, runs::MemoryBudget::of_machine(),
                                 [](const models::ModelConfig& m) { return runs::generation_memory(m); },
                                 /*quantized_gguf=*/true).model;
  } else {
    const llama::Config c{.vocab_size = o.vocab_size, .context_length = o.prompt_tokens + o.new_tokens,
                          .d_model = o.d_model, .num_layers = o.num_layers, .num_heads = o.num_heads,
                          .num_kv_heads = o.num_kv_heads, .d_ff = o.d_ff, .rope_theta = 100000.0f};
    c.validate();
    synthetic = std::make_unique<llama::TransformerLM>(c, 1);
    const bool quantized = o.weights != "f32";
    for (auto& layer : synthetic->layers) {
      for (nn::Linear* l : {&layer->attn.q_proj, &layer->attn.k_proj, &layer->attn.v_proj, &layer->attn.output_proj,
                            &layer->ffn.w1, &layer->ffn.w2, &layer->ffn.w3}) {
        if (quantized) quantize_linear(*l, weight_type(o.weights, "--weights"));
      }
    }
    if (quantized && o.head != "f32") quantize_linear(synthetic->lm_head, weight_type(o.head, "--head"));
  }
  models::LanguageModel& model = loaded ? *loaded : *synthetic;
  const int64_t V = model.vocab_size();
  LOOM_CHECK(o.prompt_tokens + o.new_tokens <= model.context_length(), "bench decode: ", o.prompt_tokens, " + ",
             o.new_tokens, " tokens exceed the model's context length ", model.context_length());
  if (auto* l = dynamic_cast<llama::TransformerLM*>(&model)) {
    l->fused_decode = o.fused;
    for (auto& layer : l->layers) {
      for (nn::Linear* lin : {&layer->attn.q_proj, &layer->attn.k_proj, &layer->attn.v_proj, &layer->attn.output_proj,
                              &layer->ffn.w1, &layer->ffn.w2, &layer->ffn.w3}) {
        r.weight_bytes += lin->quantized ? lin->quantized->nbytes() : static_cast<int64_t>(lin->weight.value.nbytes());
      }
    }
    r.weight_bytes += l->lm_head.quantized ? l->lm_head.quantized->nbytes()
                                           : static_cast<int64_t>(l->lm_head.weight.value.nbytes());
  }

  autograd::NoGradGuard no_grad;
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  double best_prefill = 1e30, best_decode = 1e30;
  for (int rep = 0; rep < o.repeats; ++rep) {
    auto cache = model.make_decode_cache(1);
    double t0 = now_seconds();
    Tensor logits = model.decode(Tensor::from_vector<int32_t>({1, o.prompt_tokens}, prompt), *cache);
    best_prefill = std::min(best_prefill, now_seconds() - t0);
    int32_t next = 1;
    const int64_t regions0 = parallel_regions();
    const double cpu0 = process_cpu_seconds();
    t0 = now_seconds();
    for (int64_t t = 0; t < o.new_tokens; ++t) {
      // Greedy choice of the next token: the decode loop's own work besides the model.
      const float* last = logits.data<float>() + (logits.numel() - V);
      next = static_cast<int32_t>(std::max_element(last, last + V) - last);
      logits = model.decode(Tensor::from_vector<int32_t>({1, 1}, {next}), *cache);
    }
    const double seconds = now_seconds() - t0, cpu = process_cpu_seconds() - cpu0;
    if (seconds < best_decode) r.decode_cpu_ms_per_token = 1e3 * cpu / static_cast<double>(o.new_tokens);
    best_decode = std::min(best_decode, seconds);
    r.parallel_regions_per_token = static_cast<double>(parallel_regions() - regions0) / static_cast<double>(o.new_tokens);
  }
  set_num_threads(saved);
  r.prefill_tok_per_s = static_cast<double>(o.prompt_tokens) / best_prefill;
  r.decode_tok_per_s = static_cast<double>(o.new_tokens) / best_decode;
  r.decode_weight_gb_per_s = static_cast<double>(r.weight_bytes) * r.decode_tok_per_s / 1e9;
  return r;
}

}  // namespace loom::bench
