// loom's own f32 GEMM: packed panels and a 6 x 16 register tile (the BLIS design: Van Zee and van de
// Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS Functionality", 2015), compiled for AVX2 + FMA.
// gemm.cpp runs it instead of oneDNN on CPUs whose widest kernels are AVX2 (Zen 1-3, Haswell to
// Alder Lake), where Debian's oneDNN 2.6 falls back to its older `gemm:jit` kernels; docs/gemm.md has
// the measurements and the rule.
//
// Legend: M rows of C, N columns of C, K the reduction; row-major; gemm.h's contract:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C (+ bias[N] on every row)
//
// Blocking (cache level each block is sized for, on Zen 3: 32 KiB L1d, 512 KiB L2):
//   K is cut into blocks of kKC; a 16-column panel of op(B) for one K block is kKC x 16 floats (16 KiB, L1);
//   the 6-row panels of op(A) for one K block and kMC rows are kMC x kKC floats (L2);
//   op(B) is packed kNC columns x one K block at a time (shared by all threads: 2 MiB, L3).
// Packing widens bf16 inputs to f32 (exact), so a bf16 GEMM costs the same as an f32 one here.
//
// Results: every element of C is the same sequence of operations whatever the thread count, the
// tiling and which thread computes it: its K products summed in order by FMAs, kKC at a time into a
// register from zero, each block's sum added to C (after alpha) in K order. So C is bitwise identical
// for any thread count (tested), which oneDNN does not promise.
#pragma once

#include <cstdint>

namespace loom::cpu {

struct BlockedGemm {
  bool trans_a = false, trans_b = false;
  bool bf16 = false;  // A and B hold bf16 (widened to f32 while packing), else f32
  int64_t batch = 1, M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0, stride_a = 0;  // stride_a: elements between batches (0: shared)
  const void* B = nullptr;
  int64_t ldb = 0, stride_b = 0;
  const float* bias = nullptr;  // [N] or null
  float* C = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int threads = 1;  // 1: the calling thread only (no parallel region)
};

// The caller (gemm.cpp) has checked the problem (sizes, leading dimensions) and handled the empty and
// K = 0 cases; M, N, K > 0 here. Runs only on a CPU with AVX2 and FMA (cpu_isa_supported(Avx2)).
namespace isa_avx2 {
void blocked_gemm(const BlockedGemm& g);
}

}  // namespace loom::cpu
