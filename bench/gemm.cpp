// GEMM microbenchmark: loom's cpu::gemm on each of its kernels (oneDNN's matmul, loom's blocked kernel:
// its AVX-512 copy on an AVX-512 CPU, else its AVX2 copy; LOOM_CPU_ISA picks) vs OpenBLAS vs the naive
// reference, on the shapes the benchmark model uses, plus the FMA peak to read the GFLOP/s against.
// Results: docs/gemm.md.
//
// Legend: T tokens (the GEMM's M in forward), C d_model, F FFN width, V vocab.
// Threads: LOOM_BENCH_THREADS (default 2) for every library; OpenBLAS's core type follows the
// environment (OPENBLAS_CORETYPE), printed in the context.
//
//   ./loom_bench_gemm --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/loss.h"
#include "backends/cpu/peak.h"
#include "core/parallel.h"
#include "core/rng.h"

using namespace loom;

namespace {

int bench_threads() {
  const char* env = std::getenv("LOOM_BENCH_THREADS");
  return env != nullptr ? std::atoi(env) : 2;
}

struct Problem {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};

// T = 2048 tokens; (in, out) pairs of the model's linear layers. For a layer x[T,in] -> y[T,out] with
// w[out,in]: forward y = x w^T; backward dx = dy w; dW = dy^T x.
std::vector<Problem> problems() {
  const int64_t T = 2048;
  const std::pair<int64_t, int64_t> layers[] = {{512, 512}, {512, 1344}, {1344, 512}, {512, 10000}};
  std::vector<Problem> out;
  for (auto [in, outf] : layers) {
    out.push_back({"fwd  y=x*W^T", false, true, T, outf, in});
    out.push_back({"bwd dx=dy*W ", false, false, T, in, outf});
    out.push_back({"bwd dW=dy^T*x", true, false, outf, in, T});
  }
  out.push_back({"square", false, false, 2048, 2048, 2048});
  return out;
}

std::vector<float> random_matrix(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_normal(v.data(), n, RngKey::from_seed(seed), 0, 0.0f, 1.0f);
  return v;
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// GFLOPs: by wall time. GFLOPs_cpu: flops per second of CPU time per thread, i.e. the rate while the
// threads actually run; on a machine shared with other jobs it estimates the uncontended rate (an
// underestimate where OpenMP threads spin at barriers).
void set_counters(benchmark::State& state, const Problem& p, double cpu_seconds) {
  const double flops = 2.0 * p.M * p.N * p.K;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs_cpu"] = flops * 1e-9 * static_cast<double>(state.iterations()) * bench_threads() /
                                 std::max(cpu_seconds, 1e-9);
  state.SetLabel(std::string(p.name) + " M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) +
                 " K=" + std::to_string(p.K));
}

enum class Lib { OneDnn, OneDnnBf16, Blocked, BlockedBf16, OpenBlas, Naive };

void BM_Gemm(benchmark::State& state, Lib lib) {
  const Problem p = problems()[static_cast<size_t>(state.range(0))];
  const int threads = bench_threads();
  set_num_threads(threads);
  openblas_set_num_threads(threads);
  const int64_t lda = p.ta ? p.M : p.K, ldb = p.tb ? p.K : p.N;
  std::vector<float> A = random_matrix(p.M * p.K, 1), B = random_matrix(p.K * p.N, 2), C(p.M * p.N);
  const bool blocked = lib == Lib::Blocked || lib == Lib::BlockedBf16;
  const bool bf16_operands = lib == Lib::OneDnnBf16 || lib == Lib::BlockedBf16;
  if (blocked && !cpu::cpu_isa_supported(cpu::CpuIsa::Avx2)) {
    state.SkipWithError("the blocked kernel needs AVX2 + FMA");
    return;
  }
  cpu::set_gemm_kernel(blocked ? cpu::GemmKernel::Blocked : cpu::GemmKernel::OneDnn);
  std::vector<bf16> A16, B16;
  if (bf16_operands) {
    for (float v : A) A16.push_back(bf16::from_float(v));
    for (float v : B) B16.push_back(bf16::from_float(v));
  }
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    switch (lib) {
      case Lib::OneDnn:
      case Lib::Blocked:
        cpu::gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), p.N);
        break;
      case Lib::OneDnnBf16:
      case Lib::BlockedBf16:
        cpu::gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, 1.0f, A16.data(), lda, B16.data(), ldb, 0.0f, C.data(), p.N);
        break;
      case Lib::OpenBlas:
        cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(p.M), static_cast<int>(p.N), static_cast<int>(p.K), 1.0f, A.data(),
                    static_cast<int>(lda), B.data(), static_cast<int>(ldb), 0.0f, C.data(), static_cast<int>(p.N));
        break;
      case Lib::Naive:
        cpu::gemm_reference(p.ta, p.tb, p.M, p.N, p.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), p.N);
        break;
    }
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, p, process_cpu_seconds() - cpu0);
  if (lib != Lib::OpenBlas && lib != Lib::Naive) {
    state.SetLabel(state.counters.empty() ? "" : std::string(p.name) + " M=" + std::to_string(p.M) + " N=" +
                   std::to_string(p.N) + " K=" + std::to_string(p.K) + " [" +
                   cpu::gemm_implementation(p.ta, p.tb, p.M, p.N, p.K,
                                            bf16_operands ? DType::BF16 : DType::F32) + "]");
  }
}

// The FMA peak, as `loom bench peak` measures it (backends/cpu/peak.h: independent FMA chains on the
// widest vectors this CPU has), on the benchmark's threads.
void BM_FmaPeak(benchmark::State& state) {
  const int threads = bench_threads();
  double gflops = 0;
  for (auto _ : state) gflops = std::max(gflops, cpu::measure_fma_peak(threads, 0.2).gflops);
  state.counters["GFLOPs_best"] = gflops;
}

// The fused cross-entropy on the LM head's logits [T, V] (it follows the biggest GEMM): forward with the
// gradient written (training) and without (evaluation). Reported as GB/s of logits read.
void BM_CrossEntropy(benchmark::State& state) {
  const int64_t T = 2048, V = 10000;
  const bool with_grad = state.range(0) != 0;
  set_num_threads(bench_threads());
  std::vector<float> logits = random_matrix(T * V, 3), grad(with_grad ? T * V : 0);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 7919) % V);
  for (auto _ : state) {
    double loss = cpu::cross_entropy_forward(logits.data(), targets.data(), T, V, -100,
                                             with_grad ? grad.data() : nullptr, 1.0f / T);
    benchmark::DoNotOptimize(loss);
  }
  state.counters["GBps"] = benchmark::Counter(T * V * 4.0 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(with_grad ? "T=2048 V=10000, loss + grad" : "T=2048 V=10000, loss only");
}

// Per-call cost of cpu::gemm on a tiny problem (16^3): the cache lookup, the memory wrappers and
// oneDNN's dispatch, i.e. what every call pays on top of the arithmetic.
void BM_GemmCallOverhead(benchmark::State& state) {
  set_num_threads(bench_threads());
  std::vector<float> A = random_matrix(256, 1), B = random_matrix(256, 2), C(256);
  for (auto _ : state) {
    cpu::gemm(false, true, 16, 16, 16, 1.0f, A.data(), 16, B.data(), 16, 0.0f, C.data(), 16);
    benchmark::DoNotOptimize(C.data());
  }
}

void register_all() {
  benchmark::AddCustomContext("threads", std::to_string(bench_threads()));
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", coretype != nullptr ? coretype : "(unset)");
  benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
  benchmark::RegisterBenchmark("fma_peak", BM_FmaPeak)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemm_call_overhead", BM_GemmCallOverhead)->UseRealTime();
  benchmark::RegisterBenchmark("cross_entropy", BM_CrossEntropy)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
  const int n = static_cast<int>(problems().size());
  for (int i = 0; i < n; ++i) {
    benchmark::RegisterBenchmark("onednn_f32", BM_Gemm, Lib::OneDnn)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("blocked_f32", BM_Gemm, Lib::Blocked)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("openblas_f32", BM_Gemm, Lib::OpenBlas)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("onednn_bf16", BM_Gemm, Lib::OneDnnBf16)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("blocked_bf16", BM_Gemm, Lib::BlockedBf16)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  // The naive loop only on the smallest layer: it is ~1000x slower.
  benchmark::RegisterBenchmark("naive_f32", BM_Gemm, Lib::Naive)->Arg(0)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
