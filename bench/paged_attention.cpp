// Paged attention as one batched decode step of `loom serve` runs it (cpu::paged_attention_forward):
// R rows, each the next token of its own sequence holding P positions, at SmolLM2-135M's shape (H = 9
// query heads over Hkv = 3 k/v heads of D = 64, blocks of 16 positions), over L = 30 layers' caches, so
// that a step reads as many cache bytes as the model's (R = 16, P = 160: 118 MB, past the last-level
// cache, as in the server). Reports the cache bytes read per second.
//   OMP_NUM_THREADS=2 ./build/bench/loom_bench_paged_attention
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "backends/cpu/paged_attention.h"
#include "core/rng.h"

using namespace loom;

namespace {

constexpr int64_t kH = 9, kHkv = 3, kD = 64, kS = 16, kLayers = 30;

void BM_PagedAttentionStep(benchmark::State& state) {
  const int64_t R = state.range(0), P = state.range(1);
  const int64_t per_seq = (P + kS) / kS, NB = R * per_seq;
  const int64_t cache_floats = NB * kHkv * kS * kD;
  std::vector<std::vector<float>> k(kLayers), v(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) {
    k[l].resize(static_cast<size_t>(cache_floats));
    v[l].resize(static_cast<size_t>(cache_floats));
    fill_normal(k[l].data(), cache_floats, RngKey::from_seed(1), static_cast<uint64_t>(2 * l), 0.0f, 1.0f);
    fill_normal(v[l].data(), cache_floats, RngKey::from_seed(1), static_cast<uint64_t>(2 * l + 1), 0.0f, 1.0f);
  }
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(R));
  std::vector<const int32_t*> table_ptrs;
  std::vector<int64_t> positions(static_cast<size_t>(R), P);
  for (int64_t r = 0; r < R; ++r) {
    // Sequences' blocks interleaved, as a server's are after requests come and go.
    for (int64_t b = 0; b < per_seq; ++b) tables[r].push_back(static_cast<int32_t>(b * R + r));
    table_ptrs.push_back(tables[r].data());
  }
  std::vector<float> q(static_cast<size_t>(R * kH * kD)), out(q.size());
  fill_normal(q.data(), static_cast<int64_t>(q.size()), RngKey::from_seed(2), 0, 0.0f, 1.0f);
  cpu::PagedAttentionProblem p;
  p.R = R, p.H = kH, p.Hkv = kHkv, p.D = kD, p.S = kS, p.NB = NB;
  p.positions = positions.data();
  p.tables = table_ptrs.data();
  for (auto _ : state) {
    for (int64_t l = 0; l < kLayers; ++l) cpu::paged_attention_forward(p, q.data(), k[l].data(), v[l].data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = 2.0 * static_cast<double>(R * (P + 1) * kHkv * kD) * sizeof(float) * kLayers;
  state.counters["cache_GB/s"] = benchmark::Counter(bytes * 1e-9 * static_cast<double>(state.iterations()),
                                                    benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_PagedAttentionStep)
    ->ArgsProduct({{1, 16}, {40, 160}})
    ->ArgNames({"R", "P"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
