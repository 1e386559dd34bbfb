#include "backends/cpu/peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "backends/cpu/isa.h"

namespace loom::cpu {
namespace {

// Independent accumulator chains hide the FMA latency (4 cycles x 2 ports needs >= 8). They must all
// stay in registers with the two constants: 16 of AVX-512's 32, but only 12 of AVX2's 16 ymm registers
// (16 chains there spilled to the stack and measured about half of Zen 3's real peak: the training
// step's GEMMs then ran at "118% MFU").
constexpr int kChains = 16;
#if defined(__AVX512F__)
constexpr int kFmaChains = kChains;
#else
constexpr int kFmaChains = 12;
#endif

#if defined(__AVX512F__)
constexpr int kVectorBits = 512;
double fma_kernel(int64_t iterations) {
  __m512 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}
constexpr int kLanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kVectorBits = 256;
double fma_kernel(int64_t iterations) {
  __m256 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  return out[0];
}
constexpr int kLanes = 8;
#else
constexpr int kVectorBits = 0;
double fma_kernel(int64_t iterations) {
  float acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = static_cast<float>(i);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kFmaChains; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  }
  return acc[0];
}
constexpr int kLanes = 1;
#endif

// Compiled for AVX512-BF16 whatever -march says; called only where the CPU reports the instruction.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_kernel(int64_t iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  // bf16 1.0 and 2^-24 in every pair: the sums grow by ~1e-7 a step and never overflow.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

// Runs kernel(iterations) on every thread for about `seconds`; the best rate in GFLOP/s.
template <typename Kernel>
double best_rate(int threads, double seconds, double flops_per_iteration, Kernel kernel) {
  const int64_t iterations = 1 << 22;  // per thread per round
  double best = 0;
  double sink = 0;  // the kernels' results, kept so that the compiler cannot drop them
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      double r = kernel(iterations);
#pragma omp atomic
      sink += r;
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double flops = flops_per_iteration * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / elapsed / 1e9);
  } while (std::chrono::steady_clock::now() < deadline);
  volatile double keep = sink;
  (void)keep;
  return best;
}

}  // namespace

bool cpu_has_bf16_dot() { return cpu_has_avx512_bf16(); }

FmaPeak measure_bf16_dot_peak(int threads, double seconds) {
  if (!cpu_has_bf16_dot()) return FmaPeak{0, threads, 0};
  return FmaPeak{best_rate(threads, seconds, 64.0 * kChains, bf16_dot_kernel), threads, 512};
}

FmaPeak measure_fma_peak(int threads, double seconds) {
  return FmaPeak{best_rate(threads, seconds, 2.0 * kLanes * kFmaChains, fma_kernel), threads, kVectorBits};
}

}  // namespace loom::cpu
