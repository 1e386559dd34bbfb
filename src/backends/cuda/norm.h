// CUDA kernels for RMSNorm and LayerNorm over the last dimension: the contracts of backends/cpu/norm.h (same
// legend, layouts and dtypes), on device memory, queued on ctx's stream.
//
// Legend: R rows, C the normalised dimension. x, y, dy, dx: [R, C] f32 or bf16; weight, bias, dweight,
// dbias: [C] f32; mean, rstd: [R] f32. Outputs are overwritten; a null output means "not wanted".
// dweight (and dbias) are deterministic: rows are cut into fixed chunks, each chunk sums into its own [C] partial,
// and the partials are added in chunk order (as on the CPU, though the chunks differ, so the bits may).
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

void rms_norm_forward(const Context& ctx, float* y, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t C, float eps);
void rms_norm_forward(const Context& ctx, bf16* y, float* rstd, const bf16* x, const float* weight, int64_t rows,
                      int64_t C, float eps);
void rms_norm_backward(const Context& ctx, float* dx, float* dweight, const float* dy, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t C);
void rms_norm_backward(const Context& ctx, bf16* dx, float* dweight, const bf16* dy, const bf16* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t C);

// The pre-norm residual step, fused as cpu::add_rms_norm_forward/backward: sum = x + residual (stored in
// T, the value normalised), y = rms_norm(sum); the backward's dsum_total = dsum + rms_norm's dx (one
// rounding), the gradient of both x and residual. dsum_total must not be null.
void add_rms_norm_forward(const Context& ctx, float* sum, float* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps);
void add_rms_norm_forward(const Context& ctx, bf16* sum, bf16* y, float* rstd, const bf16* x, const bf16* residual,
                          const float* weight, int64_t rows, int64_t C, float eps);
void add_rms_norm_backward(const Context& ctx, float* dsum_total, float* dweight, const float* dy, const float* dsum,
                           const float* sum, const float* weight, const float* rstd, int64_t rows, int64_t C);
void add_rms_norm_backward(const Context& ctx, bf16* dsum_total, float* dweight, const bf16* dy, const bf16* dsum,
                           const bf16* sum, const float* weight, const float* rstd, int64_t rows, int64_t C);

// LayerNorm, as cpu::layer_norm_forward/backward: the same corrected two-pass variance (the saved mean
// is m + c1, x - mean computed as (x - m) - c1), the same 1/max|x| rescue for rows whose squares
// overflow, and the backward's recovery of the rounded mean. bias and dbias may be null.
void layer_norm_forward(const Context& ctx, float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps);
void layer_norm_forward(const Context& ctx, bf16* y, float* mean, float* rstd, const bf16* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps);
void layer_norm_backward(const Context& ctx, float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C);
void layer_norm_backward(const Context& ctx, bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C);

}  // namespace loom::cuda
