// GEMM microbenchmark: loom's cpu::gemm on each of its kernels (oneDNN's matmul, loom's blocked kernel:
// its AVX-512 copy on an AVX-512 CPU, else its AVX2 copy; LOOM_CPU_ISA picks) vs OpenBLAS vs BLIS vs the
// naive reference, on the shapes of the three presets' training steps (CS336, GPT-2 small, dsv3-mini),
// plus the MoE's grouped GEMM and the FMA peak to read the GFLOP/s against. Results: docs/gemm.md.
// BLIS is loaded at run time (dlopen of Debian's libblis.so.4, `apt-get install libblis-dev`: its OpenMP
// build); without it its rows are skipped with a message, and nothing in the build needs it.
//
// Legend: T tokens (the GEMM's M in forward), C d_model, F FFN width, V vocab.
// Threads: LOOM_BENCH_THREADS (default 2) for every library; OpenBLAS's core type follows the
// environment (OPENBLAS_CORETYPE), printed in the context.
//
//   ./loom_bench_gemm --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <dlfcn.h>
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
  const char* preset = "cs336";
};

// The presets' linear layers, (in, out), at their tokens per step. For a layer x[T,in] -> y[T,out] with
// w[out,in]: forward y = x w^T; backward dx = dy w; dW = dy^T x. Indices 0-12 are CS336's (T = 2048,
// the first rows of docs/gemm.md), then GPT-2 small's (batch 4 x 256: T = 1024; attention's qkv and the
// MLP, the tied LM head) and dsv3-mini's (batch 8 x 256: T = 2048; the dense MLP and MTP block, the
// shared expert, the LM head).
std::vector<Problem> problems() {
  std::vector<Problem> out;
  auto layer = [&](const char* preset, int64_t T, int64_t in, int64_t outf) {
    out.push_back({"fwd  y=x*W^T", false, true, T, outf, in, preset});
    out.push_back({"bwd dx=dy*W ", false, false, T, in, outf, preset});
    out.push_back({"bwd dW=dy^T*x", true, false, outf, in, T, preset});
  };
  for (auto [in, outf] : {std::pair<int64_t, int64_t>{512, 512}, {512, 1344}, {1344, 512}, {512, 10000}})
    layer("cs336", 2048, in, outf);
  out.push_back({"square", false, false, 2048, 2048, 2048, "square"});
  for (auto [in, outf] : {std::pair<int64_t, int64_t>{768, 2304}, {768, 3072}, {3072, 768}, {768, 50257}})
    layer("gpt2", 1024, in, outf);
  for (auto [in, outf] : {std::pair<int64_t, int64_t>{384, 1024}, {1024, 384}, {384, 256}, {384, 8192}})
    layer("dsv3", 2048, in, outf);
  return out;
}

// BLIS 0.9's typed API (blis.h), found by dlopen: no header or link dependency. dim_t and inc_t are
// 64-bit in Debian's build; strides give the transposes (BLIS_NO_TRANSPOSE = 0 throughout).
using BliSgemm = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                          const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
using BliSetThreads = void (*)(int64_t);
struct Blis {
  BliSgemm sgemm = nullptr;
  BliSetThreads set_threads = nullptr;
  std::string error;
};
const Blis& blis() {
  static const Blis loaded = [] {
    Blis b;
    void* lib = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      b.error = std::string("BLIS not loaded (apt-get install libblis-dev): ") + dlerror();
      return b;
    }
    b.sgemm = reinterpret_cast<BliSgemm>(dlsym(lib, "bli_sgemm"));
    b.set_threads = reinterpret_cast<BliSetThreads>(dlsym(lib, "bli_thread_set_num_threads"));
    if (b.sgemm == nullptr || b.set_threads == nullptr) b.error = "libblis.so.4 lacks bli_sgemm";
    return b;
  }();
  return loaded;
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

enum class Lib { OneDnn, OneDnnBf16, Blocked, BlockedBf16, OpenBlas, Blis, Naive };

void BM_Gemm(benchmark::State& state, Lib lib) {
  const Problem p = problems()[static_cast<size_t>(state.range(0))];
  const int threads = bench_threads();
  set_num_threads(threads);
  openblas_set_num_threads(threads);
  const int64_t lda = p.ta ? p.M : p.K, ldb = p.tb ? p.K : p.N;
  std::vector<float> A = random_matrix(p.M * p.K, 1), B = random_matrix(p.K * p.N, 2), C(p.M * p.N);
  if (lib == Lib::Blis) {
    if (!blis().error.empty()) {
      state.SkipWithError(blis().error.c_str());
      return;
    }
    blis().set_threads(threads);
  }
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
      case Lib::Blis: {
        const float one = 1.0f, zero = 0.0f;  // op(A)(m, k) at m * rs + k * cs
        blis().sgemm(0, 0, p.M, p.N, p.K, &one, A.data(), p.ta ? 1 : lda, p.ta ? lda : 1, B.data(), p.tb ? 1 : ldb,
                     p.tb ? ldb : 1, &zero, C.data(), p.N, 1);
        break;
      }
      case Lib::Naive:
        cpu::gemm_reference(p.ta, p.tb, p.M, p.N, p.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), p.N);
        break;
    }
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, p, process_cpu_seconds() - cpu0);
  state.SetLabel(std::string(p.preset) + " " + std::string(p.name) + " M=" + std::to_string(p.M) +
                 " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K));
  if (lib != Lib::OpenBlas && lib != Lib::Naive && lib != Lib::Blis) {
    state.SetLabel(state.counters.empty() ? "" : std::string(p.preset) + " " + std::string(p.name) + " M=" + std::to_string(p.M) + " N=" +
                   std::to_string(p.N) + " K=" + std::to_string(p.K) + " [" +
                   cpu::gemm_implementation(p.ta, p.tb, p.M, p.N, p.K,
                                            bf16_operands ? DType::BF16 : DType::F32) + "]");
  }
}

// dsv3-mini's routed experts (backends/cpu/moe.h): 8192 rows (2048 tokens x 4 choices) over 16 experts of
// 512 rows each, C = 384, F = 256, as one grouped GEMM: the forward h = x w^T (rows gathered by token),
// dxp = dh w, and the weight gradient dW = dh^T x (each expert's rows the reduction). Arg: 0 fwd, 1 dx,
// 2 dW. On loom's kernel (AMX tiles for bf16 where the CPU has them) or one oneDNN GEMM per expert.
void BM_Grouped(benchmark::State& state, bool bf16_operands, bool onednn) {
  const int64_t E = 16, R = 512, P = E * R, C = 384, F = 256;
  const int form = static_cast<int>(state.range(0));
  set_num_threads(bench_threads());
  if (!onednn && !cpu::cpu_isa_supported(cpu::CpuIsa::Avx2)) {
    state.SkipWithError("the blocked kernel needs AVX2 + FMA");
    return;
  }
  cpu::set_gemm_kernel(onednn ? cpu::GemmKernel::OneDnn : cpu::GemmKernel::Auto);
  std::vector<float> x = random_matrix(2048 * C, 1), w = random_matrix(E * F * C, 2), h = random_matrix(P * F, 3);
  std::vector<float> out(std::max(P * C, E * F * C));
  std::vector<int32_t> token(P);
  for (int64_t r = 0; r < P; ++r) token[r] = static_cast<int32_t>((r * 2654435761u) % 2048);
  std::vector<bf16> x16, w16, h16;
  for (float v : x) x16.push_back(bf16::from_float(v));
  for (float v : w) w16.push_back(bf16::from_float(v));
  for (float v : h) h16.push_back(bf16::from_float(v));
  const void* X = bf16_operands ? static_cast<const void*>(x16.data()) : x.data();
  const void* W = bf16_operands ? static_cast<const void*>(w16.data()) : w.data();
  const void* H = bf16_operands ? static_cast<const void*>(h16.data()) : h.data();
  const size_t unit = bf16_operands ? 2 : 4;
  auto at = [unit](const void* base, int64_t i) { return static_cast<const char*>(base) + i * unit; };
  std::vector<cpu::GemmGroup> groups;
  for (int64_t e = 0; e < E; ++e) {
    if (form == 0) groups.push_back({R, C, X, at(W, e * F * C), out.data() + e * R * F, token.data() + e * R, nullptr});
    if (form == 1) groups.push_back({R, F, at(H, e * R * F), at(W, e * F * C), out.data() + e * R * C, nullptr, nullptr});
    if (form == 2) groups.push_back({F, R, at(H, e * R * F), X, out.data() + e * F * C, nullptr, token.data() + e * R});
  }
  const bool ta = form == 2, tb = form == 0;
  const int64_t N = form == 0 ? F : C, lda = form == 0 ? C : F, ldb = form == 0 ? C : C, ldc = N;
  for (auto _ : state) {
    if (bf16_operands) {
      cpu::gemm_grouped_bf16(ta, tb, N, 1.0f, lda, ldb, 0.0f, ldc, groups);
    } else {
      cpu::gemm_grouped(ta, tb, N, 1.0f, lda, ldb, 0.0f, ldc, groups);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * P * C * F;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const char* forms[] = {"fwd h=x*W^T (gathered x)", "dx=dh*W", "dW=dh^T*x (gathered x)"};
  state.SetLabel(std::string("dsv3 experts ") + forms[form] + " 16 x (512 x " + (form == 2 ? "256 x 384" : "256/384") +
                 ") [" + cpu::gemm_grouped_implementation(bf16_operands ? DType::BF16 : DType::F32) + "]");
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
    benchmark::RegisterBenchmark("blis_f32", BM_Gemm, Lib::Blis)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("onednn_bf16", BM_Gemm, Lib::OneDnnBf16)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("blocked_bf16", BM_Gemm, Lib::BlockedBf16)->Arg(i)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (int form = 0; form < 3; ++form) {
    benchmark::RegisterBenchmark("grouped_f32", BM_Grouped, false, false)->Arg(form)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("grouped_onednn_f32", BM_Grouped, false, true)->Arg(form)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("grouped_bf16", BM_Grouped, true, false)->Arg(form)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("grouped_onednn_bf16", BM_Grouped, true, true)->Arg(form)->UseRealTime()->Unit(benchmark::kMillisecond);
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
