// cpu::gemm against the naive reference GEMM: every transpose combination, odd sizes, padded leading
// dimensions, alpha/beta, bias, batches, bf16, the cache and determinism. The suite runs on the kernel this
// CPU gets by default; tests/CMakeLists.txt runs it again with each kernel forced (LOOM_GEMM), and the
// Gemm.Blocked* tests below drive loom's blocked kernel across its block edges on any AVX2 CPU.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_blocked.h"
#include "backends/cpu/isa.h"
#include "backends/row_sums.h"
#include "core/parallel.h"
#include "support/op_test.h"

using namespace loom;

namespace {

std::vector<float> random_vec(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_normal(v.data(), n, RngKey::from_seed(seed), 0, 0.0f, 1.0f);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  out.reserve(v.size());
  for (float x : v) out.push_back(bf16::from_float(x));
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      if (bad++ < 3) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

struct Case {
  int64_t M, N, K;
};

// Runs a scope on one GEMM kernel and restores the choice after.
class ScopedGemmKernel {
 public:
  explicit ScopedGemmKernel(cpu::GemmKernel kernel) : previous_(cpu::gemm_kernel()) { cpu::set_gemm_kernel(kernel); }
  ~ScopedGemmKernel() { cpu::set_gemm_kernel(previous_); }

 private:
  cpu::GemmKernel previous_;
};

bool blocked_kernel_runs_here() { return cpu::cpu_isa_supported(cpu::CpuIsa::Avx2); }

// The blocked kernel's copies this CPU can run (gemm_blocked.h): the copy follows cpu_isa().
std::vector<cpu::CpuIsa> blocked_copies() {
  std::vector<cpu::CpuIsa> out;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::Avx2, cpu::CpuIsa::Avx512})
    if (cpu::cpu_isa_supported(isa)) out.push_back(isa);
  return out;
}

// Runs a scope with AMX tiles allowed or not and restores the choice after.
class ScopedAmx {
 public:
  explicit ScopedAmx(bool allowed) : previous_(cpu::amx_allowed()) { cpu::set_amx_allowed(allowed); }
  ~ScopedAmx() { cpu::set_amx_allowed(previous_); }

 private:
  bool previous_;
};

// The blocked kernel's paths this CPU can run, as (isa, amx allowed): every copy, and on an AMX CPU the
// AVX-512 copy once with tiles for bf16 and once with vdpbf16ps pairs (f32 is the same on both).
std::vector<std::pair<cpu::CpuIsa, bool>> blocked_paths() {
  std::vector<std::pair<cpu::CpuIsa, bool>> out;
  for (cpu::CpuIsa isa : blocked_copies()) {
    out.push_back({isa, false});
    if (isa == cpu::CpuIsa::Avx512 && cpu::amx_usable()) out.push_back({isa, true});
  }
  return out;
}

}  // namespace

TEST(Gemm, MatchesReferenceForAllTransposesOddShapesAndBeta) {
  const Case cases[] = {{1, 1, 1}, {7, 13, 33}, {13, 7, 1}, {65, 17, 129}, {1, 33, 7}, {33, 1, 13}};
  uint64_t seed = 10;
  for (const Case& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          for (float alpha : {1.0f, -0.75f}) {
            // Padded leading dimensions (+3) check that strides are honoured.
            const int64_t lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 3, ldc = c.N + 3;
            auto A = random_vec((ta ? c.K : c.M) * lda, seed++);
            auto B = random_vec((tb ? c.N : c.K) * ldb, seed++);
            auto C0 = random_vec(c.M * ldc, seed++);
            auto got = C0, want = C0;
            cpu::gemm(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
            cpu::gemm_reference(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
            expect_near_all(got, want, 1e-4f, 1e-4f,
                            "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta));
          }
        }
      }
    }
  }
}

TEST(Gemm, BetaZeroOverwritesNaN) {
  auto A = random_vec(5 * 6, 1), B = random_vec(6 * 4, 2);
  std::vector<float> C(5 * 4, NAN), want(5 * 4, 0.0f);
  cpu::gemm(false, false, 5, 4, 6, 1.0f, A.data(), 6, B.data(), 4, 0.0f, C.data(), 4);
  cpu::gemm_reference(false, false, 5, 4, 6, 1.0f, A.data(), 6, B.data(), 4, 0.0f, want.data(), 4);
  expect_near_all(C, want, 1e-5f, 1e-5f, "beta=0 over NaN");
}

TEST(Gemm, KZeroScalesC) {
  std::vector<float> C = {1, 2, 3, 4}, want = {0.5f, 1, 1.5f, 2};
  cpu::gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, want);
}

TEST(Gemm, BiasIsAddedToEveryRow) {
  for (int tb = 0; tb < 2; ++tb) {
    const int64_t M = 9, N = 13, K = 7;
    auto A = random_vec(M * K, 3), B = random_vec(K * N, 4), bias = random_vec(N, 5), C0 = random_vec(M * N, 6);
    for (float beta : {0.0f, 1.0f}) {
      auto got = C0, want = C0;
      cpu::gemm_bias(false, tb, M, N, K, A.data(), K, B.data(), tb ? K : N, bias.data(), beta, got.data(), N);
      cpu::gemm_reference(false, tb, M, N, K, 1.0f, A.data(), K, B.data(), tb ? K : N, beta, want.data(), N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) want[m * N + n] += bias[n];
      expect_near_all(got, want, 1e-4f, 1e-4f, "bias tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
    }
  }
}

TEST(Gemm, BatchedStridedAndSharedOperands) {
  const int64_t batch = 3, M = 7, N = 13, K = 33;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (int shared : {0, 1, 2}) {  // 0: none, 1: B shared, 2: A shared
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        const int64_t sa = shared == 2 ? 0 : M * K + 5, sb = shared == 1 ? 0 : K * N + 2, sc = M * N + 1;
        auto A = random_vec(shared == 2 ? M * K : batch * sa, 7);
        auto B = random_vec(shared == 1 ? K * N : batch * sb, 8);
        auto C0 = random_vec(batch * sc, 9);
        auto got = C0, want = C0;
        cpu::gemm_batched(ta, tb, batch, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, 1.0f, got.data(),
                          N, sc);
        for (int64_t b = 0; b < batch; ++b) {
          cpu::gemm_reference(ta, tb, M, N, K, 0.5f, A.data() + b * sa, lda, B.data() + b * sb, ldb, 1.0f,
                              want.data() + b * sc, N);
        }
        expect_near_all(got, want, 1e-4f, 1e-4f,
                        "batched ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " shared=" +
                            std::to_string(shared));
      }
    }
  }
}

TEST(Gemm, Bf16MatchesReferenceOnTheSameBf16Inputs) {
  const Case cases[] = {{7, 13, 33}, {64, 48, 96}, {1, 5, 3}};
  for (const Case& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        auto Af = random_vec(c.M * c.K, 11), Bf = random_vec(c.K * c.N, 12);
        const std::vector<bf16> A = to_bf16(Af), B = to_bf16(Bf);
        const int64_t lda = ta ? c.M : c.K, ldb = tb ? c.K : c.N;
        std::vector<float> got(c.M * c.N, 1.0f), want(c.M * c.N, 1.0f);
        cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, got.data(), c.N);
        cpu::gemm_reference_bf16(ta, tb, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, want.data(), c.N);
        // Products of bf16 values are exact in f32; only the f32 accumulation order differs.
        expect_near_all(got, want, 1e-3f, 1e-4f, "bf16 ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      }
    }
  }
}

TEST(Gemm, RepeatedShapesReuseTheCachedPrimitive) {
  ScopedGemmKernel onednn(cpu::GemmKernel::OneDnn);  // the cache is oneDNN's
  auto A = random_vec(19 * 23, 1), B = random_vec(23 * 29, 2);
  std::vector<float> C(19 * 29);
  cpu::gemm(false, false, 19, 29, 23, 1.0f, A.data(), 23, B.data(), 29, 0.0f, C.data(), 29);
  const auto before = cpu::gemm_cache_stats();
  for (int i = 0; i < 5; ++i) cpu::gemm(false, false, 19, 29, 23, 1.0f, A.data(), 23, B.data(), 29, 0.0f, C.data(), 29);
  const auto after = cpu::gemm_cache_stats();
  EXPECT_EQ(after.primitives_created, before.primitives_created);
  EXPECT_EQ(after.lookups, before.lookups + 5);
}

TEST(Gemm, SameInputsAndThreadsGiveBitwiseSameResult) {
  // Big enough for oneDNN to split the work over threads (and possibly over K).
  const int64_t M = 96, N = 200, K = 1031;
  auto A = random_vec(K * M, 21), B = random_vec(N * K, 22);
  const int before = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> C1(M * N), C2(M * N);
    cpu::gemm(true, true, M, N, K, 1.0f, A.data(), M, B.data(), K, 0.0f, C1.data(), N);
    cpu::gemm(true, true, M, N, K, 1.0f, A.data(), M, B.data(), K, 0.0f, C2.data(), N);
    EXPECT_EQ(C1, C2) << "threads=" << threads;
    EXPECT_EQ(omp_get_max_threads(), threads);
  }
  set_num_threads(before);
}

TEST(Gemm, BadLeadingDimensionNamesIt) {
  std::vector<float> A(12), B(12), C(16);
  try {
    cpu::gemm(false, false, 4, 4, 3, 1.0f, A.data(), 2, B.data(), 4, 0.0f, C.data(), 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=2"), std::string::npos) << e.what();
  }
}

TEST(Gemm, SumRowsAddsBlocksOfRowsInOrder) {
  // The order of backends/row_sums.h (the CUDA kernel's): rows in blocks added from 0, then the blocks.
  for (int64_t M : {int64_t{37}, kRowSumBlock, 3 * kRowSumBlock + 5}) {
    const int64_t N = 600;
    auto x = random_vec(M * N, 31);
    std::vector<float> got(N), want(N, 0.0f);
    cpu::sum_rows(x.data(), M, N, got.data());
    for (int64_t m0 = 0; m0 < M; m0 += kRowSumBlock) {
      std::vector<float> block(N, 0.0f);
      for (int64_t m = m0; m < std::min(M, m0 + kRowSumBlock); ++m)
        for (int64_t n = 0; n < N; ++n) block[n] += x[m * N + n];
      for (int64_t n = 0; n < N; ++n) want[n] += block[n];
    }
    EXPECT_EQ(got, want) << M;  // same order of additions: bitwise equal
    const int threads = num_threads();
    set_num_threads(1);
    std::vector<float> one_thread(N);
    cpu::sum_rows(x.data(), M, N, one_thread.data());
    set_num_threads(threads);
    EXPECT_EQ(one_thread, got) << M;
  }
}

TEST(Gemm, ModelShapesUseAnOptimizedKernel) {
  // oneDNN silently falls back to a reference loop ("ref:any") for layouts it has no kernel for; the
  // dense layouts loom passes must never land there (that would be ~100x slower, not wrong).
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (DType dtype : {DType::F32, DType::BF16}) {
        const std::string impl = cpu::gemm_implementation(ta, tb, 64, 96, 80, dtype);
        EXPECT_NE(impl.rfind("ref", 0), 0u) << impl << " ta=" << ta << " tb=" << tb << " " << dtype;
      }
    }
  }
}

TEST(Gemm, Bf16WithoutBf16KernelsIsWidenedToF32) {
  // tests/CMakeLists.txt reruns this suite with oneDNN limited to AVX2 and this variable set.
  if (std::getenv("LOOM_EXPECT_BF16_WIDENED") == nullptr) GTEST_SKIP() << "only under Gemm.OnAnAvx2OnlyCpu";
  const std::string impl = cpu::gemm_implementation(false, false, 64, 96, 80, DType::BF16);
  EXPECT_EQ(impl.rfind("bf16 widened to f32", 0), 0u) << impl;
}

TEST(Gemm, CallsFromInsideAParallelRegionAreCorrect) {
  // Per-head GEMMs may run inside loom::parallel_for; oneDNN then runs on one thread per caller.
  const int64_t M = 130, N = 70, K = 257;
  auto A = random_vec(4 * M * K, 41), B = random_vec(K * N, 42);
  std::vector<float> got(4 * M * N), want(4 * M * N);
  for (int64_t i = 0; i < 4; ++i)
    cpu::gemm_reference(false, false, M, N, K, 1.0f, A.data() + i * M * K, K, B.data(), N, 0.0f,
                        want.data() + i * M * N, N);
#pragma omp parallel for num_threads(2)
  for (int64_t i = 0; i < 4; ++i)
    cpu::gemm(false, false, M, N, K, 1.0f, A.data() + i * M * K, K, B.data(), N, 0.0f, got.data() + i * M * N, N);
  expect_near_all(got, want, 1e-3f, 1e-4f, "nested");
}

TEST(Gemm, LargerBatchedAllTransposes) {
  const int64_t batch = 3, M = 130, N = 70, K = 257;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      auto A = random_vec(batch * M * K, 51), B = random_vec(batch * K * N, 52);
      std::vector<float> got(batch * M * N), want(batch * M * N);
      cpu::gemm_batched(ta, tb, batch, M, N, K, 1.0f, A.data(), lda, M * K, B.data(), ldb, K * N, 0.0f, got.data(), N,
                        M * N);
      for (int64_t b = 0; b < batch; ++b)
        cpu::gemm_reference(ta, tb, M, N, K, 1.0f, A.data() + b * M * K, lda, B.data() + b * K * N, ldb, 0.0f,
                            want.data() + b * M * N, N);
      expect_near_all(got, want, 1e-3f, 1e-4f, "large batched ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
}

TEST(Gemm, SmallSerialCallsLeaveTheCallersThreadCountAlone) {
  const int before = num_threads();
  set_num_threads(2);
  auto A = random_vec(8 * 8, 61), B = random_vec(8 * 8, 62);
  std::vector<float> C(64), want(64);
  cpu::gemm(false, false, 8, 8, 8, 1.0f, A.data(), 8, B.data(), 8, 0.0f, C.data(), 8);  // runs on 1 thread
  EXPECT_EQ(omp_get_max_threads(), 2);
  EXPECT_EQ(num_threads(), 2);
  cpu::gemm_reference(false, false, 8, 8, 8, 1.0f, A.data(), 8, B.data(), 8, 0.0f, want.data(), 8);
  expect_near_all(C, want, 1e-5f, 1e-5f, "small");
  set_num_threads(before);
}

// ---- loom's blocked kernel (gemm_blocked.h) ---------------------------------------------------------

TEST(Gemm, BlockedMatchesReferenceAcrossBlockEdges) {
  if (!blocked_kernel_runs_here()) GTEST_SKIP() << "needs AVX2 + FMA";
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  // Edges of every block of both copies: M past one row block (96 AVX2, 112 AVX-512) with a partial
  // panel (6 / 14 rows), K past one block (256 AVX2, 512 AVX-512 f32, 1024 bf16 pairs) and odd (a
  // half pair), N past one 2048-column block with a partial panel (16 / 32 columns), and a problem
  // smaller than one tile. Leading dimensions are padded by odd amounts: bf16 pairs start at any
  // 2-byte alignment.
  const Case cases[] = {{197, 45, 600}, {13, 2100, 300}, {8, 16, 256}, {9, 17, 257}, {30, 70, 1031}};
  for (auto [isa, amx] : blocked_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    uint64_t seed = 100;
    for (const Case& c : cases) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 0.5f}}) {
            const int64_t lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 5, ldc = c.N + 7;
            auto A = random_vec((ta ? c.K : c.M) * lda, seed++);
            auto B = random_vec((tb ? c.N : c.K) * ldb, seed++);
            auto C0 = random_vec(c.M * ldc, seed++);
            const std::string what = std::string(cpu::cpu_isa_name(isa)) + (amx ? " amx" : "") + " M=" + std::to_string(c.M) +
                                     " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                     " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                     " beta=" + std::to_string(beta);
            auto got = C0, want = C0;
            cpu::gemm(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
            cpu::gemm_reference(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
            expect_near_all(got, want, 1e-3f, 1e-4f, what);
            // The padding between rows of C is not C's: it must be left as it was.
            for (int64_t m = 0; m < c.M; ++m)
              for (int64_t n = c.N; n < ldc; ++n) ASSERT_EQ(got[m * ldc + n], C0[m * ldc + n]) << "padding m=" << m;
            // bf16 operands (widened while packed, or bf16 pairs: exact products either way), against the
            // reference on the same bf16 values.
            const std::vector<bf16> Ab = to_bf16(A), Bb = to_bf16(B);
            got = C0, want = C0;
            cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, alpha, Ab.data(), lda, Bb.data(), ldb, beta, got.data(), ldc);
            cpu::gemm_reference_bf16(ta, tb, c.M, c.N, c.K, alpha, Ab.data(), lda, Bb.data(), ldb, beta,
                                     want.data(), ldc);
            expect_near_all(got, want, 1e-3f, 1e-4f, "bf16 " + what);
            for (int64_t m = 0; m < c.M; ++m)
              for (int64_t n = c.N; n < ldc; ++n) ASSERT_EQ(got[m * ldc + n], C0[m * ldc + n]) << "bf16 padding m=" << m;
          }
        }
      }
    }
  }
}

TEST(Gemm, BlockedBiasBetaZeroOverNaNAndBf16) {
  if (!blocked_kernel_runs_here()) GTEST_SKIP() << "needs AVX2 + FMA";
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  for (auto [isa, amx] : blocked_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    const int64_t M = 101, N = 37, K = 520;
    auto A = random_vec(M * K, 201), B = random_vec(N * K, 202), bias = random_vec(N, 203);
    // Bias on every row; beta = 0 over NaN: the NaN must not leak in (K spans three blocks).
    std::vector<float> got(M * N, NAN), want(M * N, 0.0f);
    cpu::gemm_bias(false, true, M, N, K, A.data(), K, B.data(), K, bias.data(), 0.0f, got.data(), N);
    cpu::gemm_reference(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, want.data(), N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) want[m * N + n] += bias[n];
    expect_near_all(got, want, 1e-3f, 1e-4f, "bias over NaN");
    // bf16 operands are widened while packed or kept as bf16 pairs: exact products either way, so the
    // reference on the same bf16 values; the bias too, over NaN.
    const std::vector<bf16> Ab = to_bf16(A), Bb = to_bf16(B);
    std::fill(got.begin(), got.end(), NAN);
    std::fill(want.begin(), want.end(), 0.0f);
    cpu::gemm_bias_bf16(false, true, M, N, K, Ab.data(), K, Bb.data(), K, bias.data(), 0.0f, got.data(), N);
    cpu::gemm_reference_bf16(false, true, M, N, K, 1.0f, Ab.data(), K, Bb.data(), K, 0.0f, want.data(), N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) want[m * N + n] += bias[n];
    expect_near_all(got, want, 1e-3f, 1e-4f, "bf16 bias over NaN");
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> g(M * N, 1.0f), w(M * N, 1.0f);
        cpu::gemm_bf16(ta, tb, M, N, K, 1.0f, Ab.data(), lda, Bb.data(), ldb, 1.0f, g.data(), N);
        cpu::gemm_reference_bf16(ta, tb, M, N, K, 1.0f, Ab.data(), lda, Bb.data(), ldb, 1.0f, w.data(), N);
        expect_near_all(g, w, 1e-3f, 1e-4f, "bf16 ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      }
    }
    EXPECT_EQ(cpu::gemm_implementation(false, true, M, N, K, DType::BF16).rfind("loom blocked", 0), 0u);
  }
}

TEST(Gemm, BlockedIsBitwiseTheSameForAnyThreadCountNestingAndBatching) {
  if (!blocked_kernel_runs_here()) GTEST_SKIP() << "needs AVX2 + FMA";
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  for (auto [isa, amx] : blocked_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    // Every element is the same FMA sequence whichever thread or tile computes it (gemm_blocked.h).
    const int64_t M = 250, N = 300, K = 1100;  // K: past a K block of each copy and path
    auto A = random_vec(M * K, 301), B = random_vec(K * N, 302);
    // C on 1, 2 and 3 threads.
    auto on_threads = [&](auto&& run) {
      const int before = num_threads();
      std::vector<std::vector<float>> out;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        std::vector<float> C(M * N);
        run(C.data());
        out.push_back(C);
      }
      set_num_threads(before);
      return out;
    };
    const auto results = on_threads(
        [&](float* C) { cpu::gemm(false, false, M, N, K, 0.5f, A.data(), K, B.data(), N, 0.0f, C, N); });
    EXPECT_EQ(results[0], results[1]) << "1 vs 2 threads";
    EXPECT_EQ(results[0], results[2]) << "1 vs 3 threads";
    // bf16 (the pairs path where the CPU has AVX512-BF16) likewise.
    const std::vector<bf16> Ab = to_bf16(A), Bb = to_bf16(B);
    const auto bf16_results = on_threads(
        [&](float* C) { cpu::gemm_bf16(false, false, M, N, K, 0.5f, Ab.data(), K, Bb.data(), N, 0.0f, C, N); });
    EXPECT_EQ(bf16_results[0], bf16_results[1]) << "bf16, 1 vs 2 threads";
    EXPECT_EQ(bf16_results[0], bf16_results[2]) << "bf16, 1 vs 3 threads";
    // From inside a parallel region (one thread per call), and as entries of a batch (both batch paths).
    std::vector<float> nested(2 * M * N);
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 2; ++i)
      cpu::gemm(false, false, M, N, K, 0.5f, A.data(), K, B.data(), N, 0.0f, nested.data() + i * M * N, N);
    EXPECT_EQ(std::vector<float>(nested.begin(), nested.begin() + M * N), results[0]) << "nested";
    EXPECT_EQ(std::vector<float>(nested.begin() + M * N, nested.end()), results[0]) << "nested";
    for (int64_t batch : {2, 16}) {  // A repeated per entry, B shared
      std::vector<float> As;
      for (int64_t b = 0; b < batch; ++b) As.insert(As.end(), A.begin(), A.end());
      std::vector<float> C(batch * M * N);
      cpu::gemm_batched(false, false, batch, M, N, K, 0.5f, As.data(), K, M * K, B.data(), N, 0, 0.0f, C.data(), N,
                        M * N);
      for (int64_t b = 0; b < batch; ++b)
        EXPECT_EQ(std::vector<float>(C.begin() + b * M * N, C.begin() + (b + 1) * M * N), results[0])
            << "batch " << batch << " entry " << b;
    }
  }
}

TEST(Gemm, BlockedBatchedManySmallEntries) {
  if (!blocked_kernel_runs_here()) GTEST_SKIP() << "needs AVX2 + FMA";
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  for (auto [isa, amx] : blocked_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    // Per-head shapes: many entries, each run whole on one thread; A shared (stride 0) in one pass.
    const int64_t batch = 24, M = 40, N = 24, K = 33;
    for (int shared_a = 0; shared_a < 2; ++shared_a) {
      for (int ta = 0; ta < 2; ++ta) {
        const int64_t lda = ta ? M : K, sa = shared_a ? 0 : M * K + 3, sb = K * N + 1, sc = M * N + 2;
        auto A = random_vec(shared_a ? M * K : batch * sa, 401), B = random_vec(batch * sb, 402);
        auto C0 = random_vec(batch * sc, 403);
        auto got = C0, want = C0;
        cpu::gemm_batched(ta, false, batch, M, N, K, 1.0f, A.data(), lda, sa, B.data(), N, sb, 1.0f, got.data(), N, sc);
        for (int64_t b = 0; b < batch; ++b)
          cpu::gemm_reference(ta, false, M, N, K, 1.0f, A.data() + b * sa, lda, B.data() + b * sb, N, 1.0f,
                              want.data() + b * sc, N);
        expect_near_all(got, want, 1e-3f, 1e-4f, "shared_a=" + std::to_string(shared_a) + " ta=" + std::to_string(ta));
      }
    }
  }
}

TEST(Gemm, BlockedAvx512RunsBf16OnAmxTilesOrAsPairsWhereTheCpuHasThemAndWidensElsewhere) {
  if (!cpu::cpu_isa_supported(cpu::CpuIsa::Avx512)) GTEST_SKIP() << "needs AVX-512";
  // The three bf16 paths of the AVX-512 copy, called directly (gemm.cpp takes AMX tiles where the CPU and
  // the OS allow them, else pairs wherever it can, so the widened one runs through cpu::gemm_bf16 only on
  // AVX-512 CPUs without AVX512-BF16). M, N, K: past a row block and a K block of each, partial tiles.
  const int64_t M = 145, N = 70, K = 1100;
  auto A = random_vec(M * K, 501), B = random_vec(K * N, 502);
  const std::vector<bf16> Ab = to_bf16(A), Bb = to_bf16(B);
  std::vector<float> want(M * N);
  cpu::gemm_reference_bf16(false, false, M, N, K, 1.0f, Ab.data(), K, Bb.data(), N, 0.0f, want.data(), N);
  for (const char* path : {"widened", "pairs", "amx"}) {
    const bool pairs = std::string(path) == "pairs", amx = std::string(path) == "amx";
    if (pairs && !cpu::cpu_has_avx512_bf16()) continue;
    if (amx && !cpu::amx_usable()) continue;
    cpu::BlockedGemm g;
    g.bf16 = true;
    g.bf16_pairs = pairs;
    g.amx = amx;
    g.M = M, g.N = N, g.K = K;
    g.A = Ab.data(), g.lda = K, g.B = Bb.data(), g.ldb = N;
    std::vector<float> got(M * N, NAN);
    g.C = got.data(), g.ldc = N;
    g.threads = 2;
    cpu::isa_avx512::blocked_gemm(g);
    expect_near_all(got, want, 1e-3f, 1e-4f, path);
  }
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  cpu::ScopedCpuIsa avx512(cpu::CpuIsa::Avx512);
  const bool tiles = cpu::cpu_has_amx_bf16() && cpu::amx_allowed() && cpu::amx_usable();
  const std::string impl = cpu::gemm_implementation(false, false, M, N, K, DType::BF16);
  EXPECT_EQ(impl.find("AMX") != std::string::npos, tiles) << impl;
  EXPECT_EQ(impl.find("vdpbf16ps") != std::string::npos, !tiles && cpu::cpu_has_avx512_bf16()) << impl;
}

TEST(Gemm, AutoTakesTheAvx512BlockedKernelForLargeVocabularyLmHeadProducts) {
  if (!cpu::cpu_isa_supported(cpu::CpuIsa::Avx512)) GTEST_SKIP() << "needs AVX-512";
  ScopedGemmKernel automatic(cpu::GemmKernel::Auto);
  cpu::ScopedCpuIsa avx512(cpu::CpuIsa::Avx512);
  auto impl = [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, DType dtype) {
    return cpu::gemm_implementation(ta, tb, M, N, K, dtype);
  };
  auto blocked = [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, DType dtype) {
    return impl(ta, tb, M, N, K, dtype).rfind("loom blocked avx512", 0) == 0;
  };
  const bool rule_applies = !cpu::cpu_has_amx_bf16();  // with AMX, oneDNN's tiles keep every GEMM
  // Where oneDNN has no bf16 kernels (Gemm.OnAnAvx2OnlyCpu caps it at AVX2) the blocked kernel takes every
  // bf16 GEMM, on an AMX CPU too, where the rule itself does not apply.
  const bool onednn_has_bf16 = !blocked(false, true, 64, 96, 80, DType::BF16);
  const bool amx = cpu::cpu_has_amx_bf16();  // f32: blocked_leads_on_amx_cpu's shapes
  // GPT-2's LM head: dx in f32 (K = 50257; both rules), dW in bf16 (M = 50257) and CS336's dW (M = 10000).
  EXPECT_TRUE(blocked(false, false, 1024, 768, 50257, DType::F32));
  EXPECT_EQ(blocked(true, false, 50257, 768, 1024, DType::BF16),
            !onednn_has_bf16 || (rule_applies && cpu::cpu_has_avx512_bf16()));
  EXPECT_EQ(blocked(true, false, 10000, 512, 2048, DType::BF16),
            !onednn_has_bf16 || (rule_applies && cpu::cpu_has_avx512_bf16()));
  // Everything else stays on oneDNN: the body's products, the head's forward, the other dtype (bf16
  // only where oneDNN has bf16 kernels: Gemm.OnAnAvx2OnlyCpu caps it at AVX2, and the blocked kernel
  // then takes every bf16 GEMM).
  EXPECT_FALSE(blocked(false, true, 2048, 512, 512, DType::F32));
  // With AMX, f32: the head's dW, and GPT-2's MLP down-projection backward (B untransposed, N = 3072).
  EXPECT_EQ(blocked(true, false, 50257, 768, 1024, DType::F32), amx);
  EXPECT_EQ(blocked(false, false, 1024, 3072, 768, DType::F32), amx);
  EXPECT_EQ(blocked(true, false, 768, 3072, 1024, DType::F32), amx);
  EXPECT_FALSE(blocked(false, true, 1024, 50257, 768, DType::F32));  // the head's forward: B transposed
  EXPECT_FALSE(blocked(false, false, 1, 3072, 768, DType::F32));     // decoding: one row
  if (onednn_has_bf16) {
    EXPECT_FALSE(blocked(false, true, 2048, 512, 512, DType::BF16));
    EXPECT_FALSE(blocked(true, false, 512, 512, 2048, DType::BF16));
    EXPECT_FALSE(blocked(false, true, 1024, 50257, 768, DType::BF16));
    EXPECT_FALSE(blocked(false, false, 1024, 768, 50257, DType::BF16));
    EXPECT_FALSE(blocked(true, false, 8192, 384, 2048, DType::BF16));  // dsv3-mini's: measured no gain
  }
  // The AVX2 copy is not chosen by this rule.
  cpu::ScopedCpuIsa avx2(cpu::CpuIsa::Avx2);
  EXPECT_FALSE(blocked(false, false, 1024, 768, 50257, DType::F32));
}

TEST(Gemm, KernelChoiceErrorsNameTheValue) {
  try {
    cpu::parse_gemm_kernel("mkl");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'mkl'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, onednn, blocked"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cpu::parse_gemm_kernel("onednn"), cpu::GemmKernel::OneDnn);
  EXPECT_EQ(cpu::parse_gemm_kernel("auto"), cpu::GemmKernel::Auto);
}

TEST(Gemm, AutoTakesTheBlockedKernelForBf16WhereOneDnnHasNoBf16Kernels) {
  ScopedGemmKernel automatic(cpu::GemmKernel::Auto);
  EXPECT_EQ(cpu::gemm_implementation(false, true, 64, 96, 80, DType::F32).rfind("loom blocked", 0), std::string::npos);
  const std::string bf16_impl = cpu::gemm_implementation(false, true, 64, 96, 80, DType::BF16);
  if (!blocked_kernel_runs_here()) GTEST_SKIP() << "needs AVX2 + FMA";
  // Where oneDNN has bf16 kernels (AVX-512 BF16, AMX) they run; otherwise the blocked kernel widens.
  const bool onednn_bf16 = bf16_impl.rfind("loom blocked", 0) != 0 && bf16_impl.rfind("bf16 widened", 0) != 0;
  if (!onednn_bf16) {
    EXPECT_EQ(bf16_impl.rfind("loom blocked", 0), 0u) << bf16_impl;
  }
  // Decode-sized f32 problems stay on oneDNN even when the blocked kernel is chosen.
  ScopedGemmKernel blocked(cpu::GemmKernel::Blocked);
  EXPECT_EQ(cpu::gemm_implementation(false, true, 4, 96, 80, DType::F32).rfind("loom blocked", 0), std::string::npos);
}

// f32 stays on oneDNN except for the weight-gradient shapes its AVX2 kernel is slow at (docs/gemm.md):
// A^T B with a 256..512 output and K >= 1024, on a CPU whose best ISA is AVX2.
TEST(Gemm, AutoTakesTheBlockedKernelForTheF32ShapesOneDnnIsSlowAtOnAvx2) {
  ScopedGemmKernel automatic(cpu::GemmKernel::Auto);
  auto blocked = [](bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    return cpu::gemm_implementation(ta, tb, M, N, K, DType::F32).rfind("loom blocked", 0) == 0;
  };
  // Forward and input-gradient products, larger outputs, short K: oneDNN everywhere.
  EXPECT_FALSE(blocked(false, true, 2048, 512, 512));
  EXPECT_FALSE(blocked(false, false, 2048, 512, 512));
  EXPECT_FALSE(blocked(true, false, 640, 512, 2048));
  EXPECT_FALSE(blocked(true, false, 512, 512, 512));
  EXPECT_FALSE(blocked(true, false, 128, 512, 2048));
  const bool weight_gradient = blocked(true, false, 512, 512, 2048);
  if (cpu::cpu_isa() == cpu::CpuIsa::Avx2) {
    EXPECT_TRUE(weight_gradient);
    EXPECT_TRUE(blocked(true, false, 256, 384, 1024));
  } else {
    EXPECT_FALSE(weight_gradient) << "only measured against oneDNN's AVX2 kernel";
  }
}

// ---- grouped GEMMs (gemm_grouped: the MoE's experts) ---------------------------------------------

namespace {

// The grouped kernels this CPU can run, as (isa, amx allowed): every blocked copy, and on an AMX CPU
// the AVX-512 copy once with tiles and once with vdpbf16ps pairs.
std::vector<std::pair<cpu::CpuIsa, bool>> grouped_paths() {
  std::vector<std::pair<cpu::CpuIsa, bool>> out;
  if (cpu::gemm_kernel() == cpu::GemmKernel::OneDnn) return {{cpu::cpu_isa(), false}};  // one oneDNN path
  for (cpu::CpuIsa isa : blocked_copies()) {
    out.push_back({isa, false});
    if (isa == cpu::CpuIsa::Avx512 && cpu::cpu_has_amx_bf16()) out.push_back({isa, true});
  }
  if (out.empty()) out.push_back({cpu::cpu_isa(), false});  // the oneDNN per-group path
  return out;
}

struct GroupedProblem {
  bool ta = false, tb = false;
  int64_t N = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  std::vector<int64_t> M, K;
  bool gather_a = false, gather_b = false;
  // Per group: stored operands (a gathered operand has extra rows to pick from), indices, C.
  std::vector<std::vector<float>> A, B, C0;
  std::vector<std::vector<int32_t>> a_rows, b_rows;
};

GroupedProblem make_grouped(bool ta, bool tb, int64_t N, std::vector<int64_t> M, std::vector<int64_t> K, float alpha,
                            float beta, uint64_t seed) {
  GroupedProblem p;
  p.ta = ta;
  p.tb = tb;
  p.N = N;
  p.M = std::move(M);
  p.K = std::move(K);
  p.alpha = alpha;
  p.beta = beta;
  p.gather_a = !ta;
  p.gather_b = !tb;
  const int64_t maxM = *std::max_element(p.M.begin(), p.M.end()), maxK = *std::max_element(p.K.begin(), p.K.end());
  p.lda = (ta ? maxM : maxK) + 3;
  p.ldb = (tb ? maxK : N) + 5;
  p.ldc = N + 7;
  for (size_t g = 0; g < p.M.size(); ++g) {
    const int64_t M = p.M[g], K = p.K[g];
    // A gathered operand is a pool of 40 more rows than used, picked in a scrambled order (repeats too).
    const int64_t a_stored = ta ? K : (p.gather_a ? M + 40 : M), b_stored = tb ? N : (p.gather_b ? K + 40 : K);
    p.A.push_back(random_vec(std::max<int64_t>(a_stored, 1) * p.lda, seed++));
    p.B.push_back(random_vec(std::max<int64_t>(b_stored, 1) * p.ldb, seed++));
    p.C0.push_back(random_vec(std::max<int64_t>(M, 1) * p.ldc, seed++));
    std::vector<int32_t> ar, br;
    for (int64_t m = 0; m < M; ++m) ar.push_back(static_cast<int32_t>((m * 7 + 3 * g) % (M + 40)));
    for (int64_t k = 0; k < K; ++k) br.push_back(static_cast<int32_t>((k * 13 + 5) % (K + 40)));
    p.a_rows.push_back(ar);
    p.b_rows.push_back(br);
  }
  return p;
}

// The grouped call on f32 or bf16 copies of the operands; returns every group's C.
std::vector<std::vector<float>> run_grouped(const GroupedProblem& p, bool bf16_operands) {
  std::vector<std::vector<float>> C = p.C0;
  std::vector<std::vector<bf16>> Ab, Bb;
  for (size_t g = 0; g < p.M.size(); ++g) {
    Ab.push_back(to_bf16(p.A[g]));
    Bb.push_back(to_bf16(p.B[g]));
  }
  std::vector<cpu::GemmGroup> groups;
  for (size_t g = 0; g < p.M.size(); ++g) {
    cpu::GemmGroup grp;
    grp.M = p.M[g];
    grp.K = p.K[g];
    grp.A = bf16_operands ? static_cast<const void*>(Ab[g].data()) : p.A[g].data();
    grp.B = bf16_operands ? static_cast<const void*>(Bb[g].data()) : p.B[g].data();
    grp.C = C[g].data();
    grp.a_rows = p.gather_a ? p.a_rows[g].data() : nullptr;
    grp.b_rows = p.gather_b ? p.b_rows[g].data() : nullptr;
    groups.push_back(grp);
  }
  if (bf16_operands) {
    cpu::gemm_grouped_bf16(p.ta, p.tb, p.N, p.alpha, p.lda, p.ldb, p.beta, p.ldc, groups);
  } else {
    cpu::gemm_grouped(p.ta, p.tb, p.N, p.alpha, p.lda, p.ldb, p.beta, p.ldc, groups);
  }
  return C;
}

// The reference for group g: its gathered operands copied out, then gemm_reference (on bf16-rounded
// values when bf16_operands).
std::vector<float> grouped_reference(const GroupedProblem& p, size_t g, bool bf16_operands) {
  const int64_t M = p.M[g], K = p.K[g], N = p.N;
  auto value = [&](float v) { return bf16_operands ? bf16::from_float(v).to_float() : v; };
  std::vector<float> A(static_cast<size_t>(std::max<int64_t>(M * K, 1))), B(static_cast<size_t>(std::max<int64_t>(K * N, 1)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      A[m * K + k] = value(p.ta ? p.A[g][k * p.lda + m] : p.A[g][(p.gather_a ? p.a_rows[g][m] : m) * p.lda + k]);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      B[k * N + n] = value(p.tb ? p.B[g][n * p.ldb + k] : p.B[g][(p.gather_b ? p.b_rows[g][k] : k) * p.ldb + n]);
  std::vector<float> C = p.C0[g];
  cpu::gemm_reference(false, false, M, N, K, p.alpha, A.data(), std::max<int64_t>(K, 1), B.data(), std::max<int64_t>(N, 1),
                      p.beta, C.data(), p.ldc);
  return C;
}

}  // namespace

TEST(Gemm, GroupedMatchesReferenceWithGathersEmptyGroupsAndBlockEdges) {
  // Groups of rows 0 (skipped), 1, past a row block (96 AVX2, 112 AVX-512, 128 AMX) with a tail, and 33
  // (an AMX panel of 32 and one row), K past one K block of every path (512 f32, 1024 bf16) and odd (a
  // half pair), or 0 (C = beta C); N over two panels with a tail.
  for (auto [isa, amx] : grouped_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    uint64_t seed = 900;
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 0.5f}}) {
          if (beta == 0.0f && (ta || tb)) continue;  // beta = 0 (overwrite) once is enough
          // M-grouped (the experts' forward and dx: K shared) and K-grouped (their weight gradients).
          for (int k_grouped = 0; k_grouped < 2; ++k_grouped) {
            const GroupedProblem p = k_grouped ? make_grouped(ta, tb, 45, {37, 37, 37, 37}, {0, 1, 261, 1100}, alpha,
                                                              beta, seed)
                                               : make_grouped(ta, tb, 40, {0, 1, 130, 33}, {1031, 1031, 1031, 1031},
                                                              alpha, beta, seed);
            seed += 50;
            for (int use_bf16 = 0; use_bf16 < 2; ++use_bf16) {
              const auto got = run_grouped(p, use_bf16);
              for (size_t g = 0; g < p.M.size(); ++g) {
                const std::string what = cpu::gemm_grouped_implementation(use_bf16 ? DType::BF16 : DType::F32) +
                                         (use_bf16 ? " bf16" : " f32") + " ta=" + std::to_string(ta) +
                                         " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta) +
                                         " group " + std::to_string(g) + " M=" + std::to_string(p.M[g]) +
                                         " K=" + std::to_string(p.K[g]);
                expect_near_all(got[g], grouped_reference(p, g, use_bf16), 2e-3f, 1e-4f, what);
                for (int64_t m = 0; m < p.M[g]; ++m)  // the padding between C's rows is not C's
                  for (int64_t n = p.N; n < p.ldc; ++n)
                    ASSERT_EQ(got[g][m * p.ldc + n], p.C0[g][m * p.ldc + n]) << what << " padding m=" << m;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, GroupedIsBitwiseTheSameForAnyThreadCountAndNesting) {
  // The MoE's shapes in small: 6 groups of uneven rows; each path, f32 and bf16.
  const GroupedProblem fwd = make_grouped(false, true, 96, {300, 0, 17, 129, 250, 64}, {200, 200, 200, 200, 200, 200},
                                          1.0f, 0.0f, 1300);
  const GroupedProblem dw = make_grouped(true, false, 80, {96, 96, 96, 96}, {300, 0, 1100, 40}, 1.0f, 0.0f, 1400);
  for (auto [isa, amx] : grouped_paths()) {
    cpu::ScopedCpuIsa copy(isa);
    ScopedAmx tiles(amx);
    for (const GroupedProblem* p : {&fwd, &dw}) {
      for (int use_bf16 = 0; use_bf16 < 2; ++use_bf16) {
        const std::string what = std::string(cpu::cpu_isa_name(isa)) + (amx ? " amx" : "") + (use_bf16 ? " bf16" : " f32") +
                                 (p == &fwd ? " M-grouped" : " K-grouped");
        const int before = num_threads();
        std::vector<std::vector<std::vector<float>>> out;
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          out.push_back(run_grouped(*p, use_bf16));
        }
        set_num_threads(before);
        EXPECT_EQ(out[0], out[1]) << what << ": 1 vs 2 threads";
        EXPECT_EQ(out[0], out[2]) << what << ": 1 vs 3 threads";
        std::vector<std::vector<std::vector<float>>> nested(2);
#pragma omp parallel for num_threads(2)
        for (int i = 0; i < 2; ++i) nested[static_cast<size_t>(i)] = run_grouped(*p, use_bf16);
        EXPECT_EQ(nested[0], out[0]) << what << ": nested";
        EXPECT_EQ(nested[1], out[0]) << what << ": nested";
      }
    }
  }
}

TEST(Gemm, GroupedErrorsNameTheValue) {
  std::vector<float> A(64), B(64), C(64);
  std::vector<int32_t> rows(8, 0);
  auto group = [&](int64_t M, int64_t K) {
    cpu::GemmGroup g;
    g.M = M;
    g.K = K;
    g.A = A.data();
    g.B = B.data();
    g.C = C.data();
    return g;
  };
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ldc = message([&] { cpu::gemm_grouped(false, false, 8, 1.0f, 8, 8, 0.0f, 4, {group(2, 2)}); });
  EXPECT_NE(ldc.find("ldc=4"), std::string::npos) << ldc;
  const std::string lda =
      message([&] { cpu::gemm_grouped(false, false, 4, 1.0f, 3, 4, 0.0f, 4, {group(2, 2), group(2, 5)}); });
  EXPECT_NE(lda.find("lda=3"), std::string::npos) << lda;
  EXPECT_NE(lda.find("group 1"), std::string::npos) << lda;
  const std::string m = message([&] { cpu::gemm_grouped(false, false, 4, 1.0f, 8, 4, 0.0f, 4, {group(-1, 2)}); });
  EXPECT_NE(m.find("M=-1"), std::string::npos) << m;
  cpu::GemmGroup gathered = group(2, 2);
  gathered.a_rows = rows.data();
  const std::string t = message([&] { cpu::gemm_grouped(true, false, 4, 1.0f, 8, 4, 0.0f, 4, {gathered}); });
  EXPECT_NE(t.find("transposed A"), std::string::npos) << t;
}
