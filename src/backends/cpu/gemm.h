// CPU GEMM: BLAS-style entry points backed by oneDNN's matmul primitive or loom's own blocked kernel
// (gemm_blocked.h; which one: GemmKernel below), plus the naive reference GEMM that the tests use as the
// oracle. Measurements and the choice: docs/gemm.md.
//
// Legend: M rows of C, N columns of C, K the reduction; all matrices are row-major.
//
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C      (+ bias[N] broadcast over rows, if given)
//
//   op(A) = A, stored [M,K] with row stride lda (>= K),   or A^T when trans_a (A stored [K,M], lda >= M)
//   op(B) = B, stored [K,N] with row stride ldb (>= N),   or B^T when trans_b (B stored [N,K], ldb >= K)
//   C stored [M,N] with row stride ldc (>= N).
//
// beta = 0 overwrites C (whatever it held, NaN included); beta != 0 accumulates into it (oneDNN's
// "sum" post-op), which lets weight gradients accumulate in place.
//
// Caching: a oneDNN primitive is created the first time a problem (shapes, strides, transposes, dtype,
// alpha, beta, bias, thread count) is seen, and reused afterwards, so a training loop that repeats its
// shapes pays one hash lookup per call. The cache is process-wide (a pure memo: it changes only speed,
// never results) and guarded by a mutex, so concurrent callers are safe.
//
// Threads: every call runs on loom::num_threads() threads (oneDNN here uses the OpenMP runtime; the
// calling thread's OpenMP thread count is set to match), except problems under ~4 MFLOP, which run on
// one thread, and calls from inside a parallel region, which run on their caller's thread.
// Determinism: the same inputs and thread count give bitwise the same C.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom::cpu {

// f32 GEMM.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// f32 GEMM with a bias row added to every row of C: C = op(A) @ op(B) + bias (+ beta * C).
// (alpha is fixed to 1: oneDNN applies the bias before the output scale.)
void gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, const float* bias, float beta, float* C, int64_t ldc);

// Batched, strided f32 GEMM: for b in [0, batch): C + b*stride_c = op(A + b*stride_a) @ op(B + b*stride_b).
// stride_b = 0 shares one B among all batches (likewise stride_a = 0 shares A).
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);

// bf16 inputs, f32 accumulation and f32 output (AMX / AVX512-BF16 kernels where the CPU has them).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bias_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
                    int64_t lda, const bf16* B, int64_t ldb, const float* bias, float beta, float* C,
                    int64_t ldc);
void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                       float alpha, const bf16* A, int64_t lda, int64_t stride_a, const bf16* B,
                       int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);

// A grouped GEMM: products that share the transposes, N, the leading dimensions, alpha and beta, each
// with its own M, K and operands:  C_g[M_g, N] = alpha * op(A_g)[M_g, K_g] @ op(B_g)[K_g, N] + beta * C_g.
// A gather may stand in for a copy: a_rows (A not transposed) makes op(A_g) row m the stored row
// a_rows[m] of A_g, b_rows (B not transposed) makes op(B_g) row k the stored row b_rows[k] of B_g.
// A group with M = 0 is skipped; one with K = 0 leaves beta * C_g. A and B are float for gemm_grouped,
// bf16 for gemm_grouped_bf16; C is f32.
// The MoE's routed experts (backends/cpu/moe.h): one call runs every expert, whatever its row count.
// Kernel: loom's blocked kernel (gemm_blocked.h) where the CPU has AVX2 and gemm_kernel() is not OneDnn:
// one parallel region, each group's op(B) packed once for all its row blocks; bf16 by AMX tiles where
// the CPU has AMX-BF16 and amx_allowed(), else by vdpbf16ps pairs with AVX512-BF16, else widened.
// Otherwise one oneDNN GEMM per group, each on one thread. Either way the result is bitwise the same
// for any thread count (it differs between the kernels, and so between CPU kinds).
struct GemmGroup {
  int64_t M = 0, K = 0;
  const void* A = nullptr;
  const void* B = nullptr;
  float* C = nullptr;
  const int32_t* a_rows = nullptr;  // [M] or null
  const int32_t* b_rows = nullptr;  // [K] or null
};
void gemm_grouped(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta,
                  int64_t ldc, const std::vector<GemmGroup>& groups);
void gemm_grouped_bf16(bool trans_a, bool trans_b, int64_t N, float alpha, int64_t lda, int64_t ldb, float beta,
                       int64_t ldc, const std::vector<GemmGroup>& groups);

// Whether grouped bf16 GEMMs may use AMX tiles (on a CPU that has them): true unless LOOM_AMX=off or
// set_amx_allowed(false) (tests and benchmarks, to run the vdpbf16ps path on an AMX CPU).
bool amx_allowed();
void set_amx_allowed(bool allowed);
// What a grouped GEMM of this dtype runs on here, e.g. "loom blocked avx512 amx 32x32".
std::string gemm_grouped_implementation(DType dtype);

// The reference: a triple loop accumulating in double, single-threaded. Same contract as gemm().
// Slow on purpose; the tests' oracle and bench/gemm.cpp's baseline.
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);
void gemm_reference_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                         int64_t ldc);

// out[n] = sum over rows m of x[m, n], x: [M,N] dense, in the order of backends/row_sums.h (blocks of
// rows), so the result depends on neither the thread count nor the backend (a linear layer's bias gradient).
void sum_rows(const float* x, int64_t M, int64_t N, float* out);

// Primitive cache statistics (tests check that repeated shapes reuse the primitive).
struct GemmCacheStats {
  int64_t primitives_created = 0;
  int64_t lookups = 0;
};
GemmCacheStats gemm_cache_stats();

// Which kernel runs the GEMMs: oneDNN's matmul, or loom's blocked AVX2 kernel (gemm_blocked.h).
//   Auto (the default): oneDNN, which the blocked kernel only matches on most shapes (docs/gemm.md),
//        except where the blocked kernel was measured ahead: for bf16 operands on a CPU where oneDNN has
//        no bf16 kernels (AVX2 only: Zen 1-3, Haswell to Alder Lake; it widens them while packing instead
//        of copying both to f32), the weight gradients of d_model-512 models on AVX2, two LM-head
//        products of a large vocabulary on AVX-512 CPUs without AMX, and on AVX-512 CPUs with AMX the f32
//        products oneDNN 2.6 is slow at there (B untransposed with N >= 3072, the LM head's dx and dW at
//        a vocabulary >= 16384; gemm.cpp names the shapes).
//   OneDnn, Blocked: every GEMM on that kernel (Blocked needs AVX2 + FMA; on an AVX-512 CPU it runs the
//        AVX-512 copy, with bf16 pairs by vdpbf16ps where the CPU has AVX512-BF16).
// LOOM_GEMM=auto|onednn|blocked sets it for the process, set_gemm_kernel for tests and benchmarks.
// Under Blocked, f32 problems of fewer than 8 rows (decoding) still run on oneDNN.
enum class GemmKernel { Auto, OneDnn, Blocked };
GemmKernel gemm_kernel();
void set_gemm_kernel(GemmKernel kernel);  // Blocked: an error naming the CPU if it lacks AVX2 + FMA
const char* gemm_kernel_name(GemmKernel kernel);
GemmKernel parse_gemm_kernel(const char* text);  // "auto", "onednn" or "blocked"; an error naming the text

// The implementation chosen for a problem (e.g. "brg:avx512_core"), for benchmarks and docs.
// dtype is F32 or BF16.
std::string gemm_implementation(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType dtype);

}  // namespace loom::cpu
