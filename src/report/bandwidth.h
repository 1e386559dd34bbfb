// Memory-bandwidth benchmarks: what the machine can stream from DRAM, and what the quantized matmul
// achieves while decoding (weight bytes read per second), so docs/quant.md can put the two side by side.
#pragma once

#include <cstdint>
#include <string>

#include "quant/qmatmul.h"

namespace loom::report {

struct BandwidthResult {
  double gb_per_s = 0;  // 1 GB = 1e9 bytes
  int64_t bytes = 0;    // buffer size
  int threads = 0;
};

// Sums a `bytes`-sized f32 buffer (much larger than the caches) on `threads` threads, each reading its
// own contiguous slice, `repeats` times; reports the best pass. A read-only stream, like decoding.
BandwidthResult measure_read_bandwidth(int threads, int64_t bytes = int64_t{1} << 30, int repeats = 5);

struct QuantMatmulBenchResult {
  std::string type, path;
  int64_t M = 0, N = 0, K = 0;
  double seconds = 0;           // per call (best of the timed calls)
  double weight_gb_per_s = 0;   // weight bytes / seconds
  double gflops = 0;            // 2*M*N*K / seconds
  int threads = 0;
};

// Times quantized_matmul on random weights of `type` ("f32" times the oneDNN f32 GEMM instead, the
// path the model takes without quantized weights).
QuantMatmulBenchResult bench_quantized_matmul(const std::string& type, int64_t M, int64_t N, int64_t K,
                                              quant::KernelPath path, int threads, int calls = 50);

}  // namespace loom::report
