// loom's own GEMM: packed panels and a register tile (the BLIS design: Van Zee and van de Geijn, "BLIS: A
// Framework for Rapidly Instantiating BLAS Functionality", 2015), compiled twice:
//   isa_avx2    a 6 x 16 tile of ymm accumulators (AVX2 + FMA: 16 registers);
//   isa_avx512  a 14 x 32 tile of zmm accumulators (AVX-512: 32 registers), and, on CPUs with
//               AVX512-BF16, the same tile over bf16 pairs multiplied by `vdpbf16ps` (bf16_pairs).
// gemm.cpp chooses it or oneDNN per CPU and dtype (gemm.h, GemmKernel); docs/gemm.md has the
// measurements and the rule.
//
// Legend: M rows of C, N columns of C, K the reduction; row-major; gemm.h's contract:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C (+ bias[N] on every row)
//
// Blocking (cache level each block is sized for; Zen 3 and 4: 32 KiB L1d, 512 KiB / 1 MiB L2):
//   K is cut into blocks of kKC; a kNR-column panel of op(B) for one K block stays in L1 (16-24 KiB);
//   the kMR-row panels of op(A) for one K block and kMC rows stay in L2 (96-126 KiB);
//   op(B) is packed kNC columns x one K block at a time (shared by all threads: 2 MiB at most, L3).
// Packing widens bf16 inputs to f32 (exact), so a bf16 GEMM costs the same as an f32 one, except on the
// bf16 pairs path, which packs bf16 as it is and runs at twice the f32 rate.
//
// Results: every element of C is the same sequence of operations whatever the thread count, the
// tiling and which thread computes it: its K products summed in order by FMAs (or by vdpbf16ps, two
// products at a time), kKC at a time into a register from zero, each block's sum added to C (after
// alpha) in K order. So C is bitwise identical for any thread count (tested), which oneDNN does not
// promise. The two copies (and the two bf16 paths) differ from each other in the last bits: their K
// blocks differ, and vdpbf16ps flushes denormals.
#pragma once

#include <cstdint>

namespace loom::cpu {

struct BlockedGemm {
  bool trans_a = false, trans_b = false;
  bool bf16 = false;  // A and B hold bf16 (widened to f32 while packing), else f32
  // bf16 only, isa_avx512 only, and only on a CPU with AVX512-BF16 (cpu_has_avx512_bf16()): keep bf16
  // pairs and multiply them by vdpbf16ps instead of widening. Ignored by isa_avx2.
  bool bf16_pairs = false;
  // bf16 only, isa_avx512 only, on a CPU with AMX-BF16 whose tiles the OS granted (amx_usable()): the
  // grouped driver's 32 x 32 AMX tile (gemm_blocked.inc, Tiles) instead of bf16_pairs.
  bool amx = false;
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

// A grouped GEMM (gemm.h, gemm_grouped): products that share the transposes, N, the leading dimensions,
// alpha and beta, each with its own M, K and operands, in one parallel region. Each group's op(B) is
// packed once, whole, before any product runs, and read by all of that group's row blocks; the tasks
// (group x block of kMC rows x share of the panels) then run without a barrier between groups, each
// walking its K blocks in order. So every element of C sees the same operations as in blocked_gemm:
// bitwise the same for any thread count.
struct BlockedGemmGroup {
  int64_t M = 0, K = 0;
  const void* A = nullptr;
  const void* B = nullptr;
  float* C = nullptr;
  const int32_t* a_rows = nullptr;  // op(A) row m is row a_rows[m] of A (A not transposed), else m
  const int32_t* b_rows = nullptr;  // op(B) row k is row b_rows[k] of B (B not transposed), else k
};
struct GroupedBlockedGemm {
  bool trans_a = false, trans_b = false;
  bool bf16 = false, bf16_pairs = false;  // as BlockedGemm
  bool amx = false;  // bf16 only, isa_avx512 only, on a CPU with AMX-BF16 whose tiles the OS granted (amx_usable())
  int64_t N = 0;
  float alpha = 1.0f, beta = 0.0f;
  int64_t lda = 0, ldb = 0, ldc = 0;
  const BlockedGemmGroup* groups = nullptr;
  int64_t count = 0;
  int threads = 1;
};

// Whether this process may use AMX tiles: the CPU has AMX-BF16 and Linux granted the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). False elsewhere.
bool amx_usable();

// The caller (gemm.cpp) has checked the problem (sizes, leading dimensions) and handled the empty and
// K = 0 cases; M, N, K > 0 here. Each copy runs only on a CPU that cpu_isa_supported() says can.
// grouped_gemm: every group with M > 0 and N > 0 (a group with K = 0 leaves beta * C).
namespace isa_avx2 {
void blocked_gemm(const BlockedGemm& g);
void grouped_gemm(const GroupedBlockedGemm& g);
}
namespace isa_avx512 {
void blocked_gemm(const BlockedGemm& g);
void grouped_gemm(const GroupedBlockedGemm& g);
}

}  // namespace loom::cpu
