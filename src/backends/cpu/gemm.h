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

// The reference: a triple loop accumulating in double, single-threaded. Same contract as gemm().
// Slow on purpose; the tests' oracle and bench/gemm.cpp's baseline.
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);
void gemm_reference_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                         int64_t ldc);

// out[n] = sum over rows m of x[m, n], x: [M,N] dense. Rows are summed in order for each column, so the
// result does not depend on the thread count (the bias gradient of a linear layer).
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
//        of copying both to f32), the weight gradients of d_model-512 models on AVX2, and two LM-head
//        products of a large vocabulary on AVX-512 CPUs without AMX (gemm.cpp names the shapes).
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
