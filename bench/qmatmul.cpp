// The quantized matmul kernels side by side in one process: the AVX-512 VNNI path against the AMX path
// (its 16-row pair groups through int8 tiles) on one thread, as the fused decode step calls them
// (quantized_matmul_rows over a share of W's rows, activations already quantized), at the row counts of
// a batched decode step: M tokens with int8 (one activation row each) or int8x2 (two, whose integer
// dots each path combines before its f32 work; M = 16: 16 sequences), a call per 64 rows of W (256 of the head),
// the smallest chunks the step's phases hand out.
//   ./build/bench/loom_bench_qmatmul --benchmark_min_time=0.2 --benchmark_repetitions=5
// Arguments: path (0 avx512-vnni, 1 amx), M tokens, N, K, weights (0 Q4_1 as SmolLM2's layers, 1 Q8_0
// as its head), rounding (0 int8, 1 int8x2), the [N, K] matrix small enough to stay in L2 (the step reads a chunk of 64-256
// rows of W at a time, and the rows' activations stay in L1/L2), so this times the kernels, not DRAM. "MACs" is multiply-adds per
// second. Each run first checks that both paths give the same bits where the CPU has both.
// BM_QuantizeActivations times the activations' quantization that precedes each of the step's matmuls;
// BM_TeamMatmul how a 16-token matmul scales from one thread to two as the step's phases split it.
// On a shared machine quote the best repetition of each: others' jobs only ever add time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "quant/qmatmul.h"

using namespace loom;
using namespace loom::quant;

namespace {

const KernelPath kPaths[] = {KernelPath::Avx512Vnni, KernelPath::Amx};

void BM_QuantizedMatmulRows(benchmark::State& state) {
  const KernelPath path = kPaths[state.range(0)];
  const int64_t M = state.range(1), N = state.range(2), K = state.range(3);
  const QuantType type = state.range(4) == 0 ? QuantType::Q4_1 : QuantType::Q8_0;
  const ActivationRounding rounding = state.range(5) == 0 ? ActivationRounding::Int8 : ActivationRounding::Int8x2;
  const int64_t chunk = type == QuantType::Q8_0 ? 256 : 64;  // the step's head chunks, and the others'
  if (!kernel_path_supported(path)) {
    state.SkipWithError((std::string(kernel_path_name(path)) + " kernels: not supported by this CPU").c_str());
    return;
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(M * K));
  for (float& v : w) v = normal(gen);
  for (float& v : x) v = normal(gen);
  const QuantizedMatrix q = QuantizedMatrix::quantize(type, w.data(), N, K);
  std::vector<ActBlock> a(static_cast<size_t>(M * activation_levels(rounding) * K / 32));
  quantize_activation_rows(x.data(), M, K, a.data(), KernelPath::Avx512Vnni, rounding);
  // The AMX path reads its activation tiles from their copy, as the step's phases make it.
  std::vector<int8_t> tiles(static_cast<size_t>(activation_tile_bytes(M * activation_levels(rounding), K)));
  pack_activation_tiles(a.data(), 0, M * activation_levels(rounding), K, tiles.data());
  const int8_t* t = path == KernelPath::Amx ? tiles.data() : nullptr;
  std::vector<float> y(static_cast<size_t>(M * N)), other(y.size());
  quantized_matmul_rows(a.data(), M, q, 0, N, y.data(), N, path, rounding, t);
  // The other path where the CPU has it (an AMX-less CPU runs only the VNNI cases): the same bits.
  if (const KernelPath p = kPaths[1 - state.range(0)]; kernel_path_supported(p)) {
    quantized_matmul_rows(a.data(), M, q, 0, N, other.data(), N, p, rounding);
    if (std::memcmp(y.data(), other.data(), y.size() * sizeof(float)) != 0) {
      state.SkipWithError((std::string("the outputs differ from the ") + kernel_path_name(p) + " path's").c_str());
      return;
    }
  }
  // In chunks of rows of W, as the fused step's phases hand them out (each call sets up its tiles).
  for (auto _ : state) {
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      quantized_matmul_rows(a.data(), M, q, n0, std::min(N, n0 + chunk), y.data(), N, path, rounding, t);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(kernel_path_name(path)) + " " + quant_type_name(type) + " " + activation_rounding_name(rounding));
  state.counters["MACs"] = benchmark::Counter(static_cast<double>(state.iterations() * M * N * K), benchmark::Counter::kIsRate);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int rounding = 0; rounding < 2; ++rounding) {
    for (int64_t M : {1, 2, 4, 8, 15, 16, 32, 64}) {
      for (int path = 0; path < 2; ++path) {
        b->Args({path, M, 1536, 576, 0, rounding});  // w1 / w3 of SmolLM2-135M (Q4_1)
        b->Args({path, M, 576, 1536, 0, rounding});  // w2
        b->Args({path, M, 4096, 576, 1, rounding});  // a slice of its head (Q8_0 in the GGUF file)
      }
    }
  }
}

// The activations' quantization a batched step does before each matmul (int8 or int8x2), on one thread:
// M rows of K, SmolLM2's widths (576 the residual stream, 1536 w2's input). "floats" per second.
void BM_QuantizeActivations(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1);
  const ActivationRounding rounding = state.range(2) == 0 ? ActivationRounding::Int8 : ActivationRounding::Int8x2;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = normal(gen);
  std::vector<ActBlock> a(static_cast<size_t>(M * activation_levels(rounding) * K / 32));
  for (auto _ : state) {
    quantize_activation_rows(x.data(), M, K, a.data(), KernelPath::Auto, rounding);
    benchmark::DoNotOptimize(a.data());
  }
  state.SetLabel(activation_rounding_name(rounding));
  state.counters["floats"] = benchmark::Counter(static_cast<double>(state.iterations() * M * K), benchmark::Counter::kIsRate);
}

// A 16-token int8x2 matmul [12288, 576] (Q4_1) in 64-row chunks on a team of `threads` threads that
// claim them as the fused step's phases do (core/parallel.h ClaimedPhases, each thread a contiguous
// home range first), the output on a cache line or 16 bytes off one (as std::vector's memory is). How
// the step's work scales from one thread to two: with one counter handing the chunks out alternately
// two threads took 0.41-0.44 ms against one thread's 0.66-0.70, with the output off a line 0.48-0.52;
// with home ranges 0.38 against 0.75-0.76, off a line 0.39-0.40 (Intel Xeon with AMX; docs/serve.md,
// "Two threads sharing a step"). The third argument: 1 gives the AMX kernels the activation tiles'
// copy (pack_activation_tiles, as the step does), 0 has them read the ActBlocks in place. Real time.
void BM_TeamMatmul(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t offset_floats = state.range(1);  // 0: the output on a line; 4: 16 bytes off
  const bool use_tiles = state.range(2) != 0;
  constexpr int64_t M = 16, N = 12288, K = 576, kChunk = 64;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(M * K));
  for (float& v : w) v = normal(gen);
  for (float& v : x) v = normal(gen);
  const QuantizedMatrix q = QuantizedMatrix::quantize(QuantType::Q4_1, w.data(), N, K);
  std::vector<ActBlock> a(static_cast<size_t>(M * 2 * K / 32));
  quantize_activation_rows(x.data(), M, K, a.data(), KernelPath::Auto, ActivationRounding::Int8x2);
  std::vector<int8_t> tiles(static_cast<size_t>(activation_tile_bytes(M * 2, K)));
  pack_activation_tiles(a.data(), 0, M * 2, K, tiles.data());
  const int8_t* t = use_tiles ? tiles.data() : nullptr;
  std::vector<float> memory(static_cast<size_t>(M * N + 32));
  float* y = memory.data();
  while (reinterpret_cast<uintptr_t>(y) % 64 != 0) ++y;
  y += offset_floats;
  const int64_t chunks = N / kChunk;
  for (auto _ : state) {
    loom::ClaimedPhases phases(1, threads);
    loom::parallel_team(threads, [&](loom::Team& team) {
      phases.run(0, chunks, team.rank(), [] {}, [&](int64_t c) {
        quantized_matmul_rows(a.data(), M, q, c * kChunk, (c + 1) * kChunk, y, N, KernelPath::Auto, ActivationRounding::Int8x2, t);
      });
    });
    benchmark::DoNotOptimize(y);
  }
  state.SetLabel(std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                 (offset_floats == 0 ? ", output on a line" : ", output 16 bytes off a line") +
                 (use_tiles ? ", tiles copied" : ", tiles in place"));
  state.counters["MACs"] = benchmark::Counter(static_cast<double>(state.iterations() * M * N * K), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_QuantizedMatmulRows)->Apply(Args);
BENCHMARK(BM_TeamMatmul)
    ->Args({1, 0, 0})
    ->Args({1, 0, 1})
    ->Args({2, 0, 0})
    ->Args({2, 0, 1})
    ->Args({2, 4, 1})
    ->UseRealTime();
BENCHMARK(BM_QuantizeActivations)->ArgsProduct({{1, 16}, {576, 1536}, {0, 1}});
BENCHMARK_MAIN();
