// GEMMs on the GPU through cuBLASLt: the layout contract of backends/cpu/gemm.h (row-major, the same
// trans/ld conventions), with bf16 inputs accumulating in f32 and the bias (+GELU) added in cuBLASLt's
// epilogue instead of a separate pass.
//
// Legend: M rows of C, N columns of C, K the reduction; all matrices are row-major.
//
//   C[M,N] = epilogue(alpha * op(A)[M,K] @ op(B)[K,N] + beta * C + bias[N])
//
//   op(A) = A [M,K] (lda >= K), or A^T when trans_a (A stored [K,M], lda >= M); likewise B with ldb.
//   C [M,N] with ldc >= N. beta = 0 overwrites C.
//   f32 inputs compute in plain f32 (no TF32), to match the CPU; bf16 inputs accumulate in f32 and
//   write f32 or bf16 (rounded once).
//   The epilogue: None, Bias (bias[N] added to every row, f32), or BiasGelu (then GELU, tanh form, as
//   GPT-2's). Batched: C + b*stride_c = op(A + b*stride_a) @ op(B + b*stride_b) for b < batch.
//
// Row-major C = A @ B is computed as column-major C^T = B^T @ A^T: cuBLASLt's A is our B.
// Each device has one cuBLASLt handle and a 32 MiB workspace from its caching allocator.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

enum class GemmEpilogue { None, Bias, BiasGelu };

struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  DType input = DType::F32;   // A and B: F32 or BF16
  DType output = DType::F32;  // C: F32, or BF16 with BF16 inputs
  const float* bias = nullptr;
  GemmEpilogue epilogue = GemmEpilogue::None;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // elements
};

// Validates the problem (errors name the value) and queues it on ctx's stream.
void gemm(const Context& ctx, const GemmProblem& p);

// The typed forms the ops use.
void gemm(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const float* bias = nullptr, GemmEpilogue epilogue = GemmEpilogue::None);
void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc,
               const float* bias = nullptr, GemmEpilogue epilogue = GemmEpilogue::None);
void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc,
               const float* bias = nullptr, GemmEpilogue epilogue = GemmEpilogue::None);

}  // namespace loom::cuda
