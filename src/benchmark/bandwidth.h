// Memory-bandwidth benchmarks: what the machine can stream from DRAM, and what the quantized matmul
// achieves while decoding (weight bytes read per second), so docs/quant.md can put the two side by side.
#pragma once

#include <cstdint>
#include <string>

#include "quant/qmatmul.h"

namespace loom::bench {

struct BandwidthResult {
  double gb_per_s = 0;  // 1 GB = 1e9 bytes
  int64_t bytes = 0;    // buffer size
  int threads = 0;
  std::string to_json() const;  // `loom bench bandwidth`'s line
};

// Sums a `bytes`-sized f32 buffer (much larger than the caches) on `threads` threads, each reading its
// own contiguous slice, `repeats` times; reports the best pass. A read-only stream, like decoding.
BandwidthResult measure_read_bandwidth(int threads, int64_t bytes = int64_t{1} << 30, int repeats = 5);

struct QuantMatmulBenchResult {
  std::string type, path;
  int64_t M = 0, N = 0, K = 0;
  double seconds = 0;           // per call (median of the timed calls)
  double weight_gb_per_s = 0;   // weight bytes / seconds
  double gflops = 0;            // 2*M*N*K / seconds
  int threads = 0;
  std::string to_json() const;  // `loom bench qmatmul`'s line
};

// Times quantized_matmul on random weights of `type` ("f32" times the oneDNN f32 GEMM instead, the
// path the model takes without quantized weights).
QuantMatmulBenchResult bench_quantized_matmul(const std::string& type, int64_t M, int64_t N, int64_t K,
                                              quant::KernelPath path, int threads, int calls = 50);

struct DecodeBenchOptions {
  // The model: SmolLM2-135M's shape by default (a Llama with GQA; vocab 49152).
  int64_t vocab_size = 49152, d_model = 576, num_layers = 30, num_heads = 9, num_kv_heads = 3, d_ff = 1536;
  std::string weights = "Q4_1";  // the Linear layers: f32, Q8_0, Q4_0 or Q4_1
  std::string head = "Q8_0";     // lm_head when weights are quantized (SmolLM2's GGUF stores its tied head in Q8_0)
  int64_t prompt_tokens = 4, new_tokens = 64;
  int threads = 0;               // 0: loom::num_threads()
  int repeats = 3;               // prefill + decode runs; the best is reported
  bool fused = true;             // TransformerLM::fused_decode (false: the op-by-op decode step)
  std::string gguf;              // a Llama GGUF file to time instead (its matrices kept quantized; the
                                 // shape and type options are then ignored)
};

struct DecodeBenchResult {
  double prefill_tok_per_s = 0, decode_tok_per_s = 0;
  int64_t weight_bytes = 0;          // bytes of the matmul weights a decode step reads (layers + head)
  double decode_weight_gb_per_s = 0; // weight_bytes * decode_tok_per_s
  int threads = 0;
  double parallel_regions_per_token = 0;  // parallel regions (core/parallel.h) per decode step
  double decode_cpu_ms_per_token = 0;     // process CPU time per decode step, all threads (spinning included)
  std::string to_json() const;
};

// A synthetic (randomly initialised) Llama (or options.gguf's model) of the given shape, its Linear weights quantized as asked,
// timed on a prefill of prompt_tokens and new_tokens single-token decode steps through the KV cache.
DecodeBenchResult bench_decode(const DecodeBenchOptions& options);

}  // namespace loom::bench
