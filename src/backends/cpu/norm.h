// CPU kernels for the normalisations over the last dimension (RMSNorm, LayerNorm).
//
// Legend: R rows (the product of all leading dimensions, B*T for activations), C the normalised dimension.
// Conventions:
//   * x, y, dy, dx are contiguous [R, C]; weight, bias, dweight, dbias are [C]; mean and rstd are [R].
//   * x/y/dy/dx are f32 or bf16 (bf16 is widened to f32 for all arithmetic and rounded once on store);
//     the forwards also take an f32 x with a bf16 y (mixed precision: the norm rounds its output for the
//     bf16 GEMMs that read it; the backward is then the f32 one, with the f32 dy those GEMMs return);
//     weight, bias, statistics and parameter gradients are always f32.
//   * Every output is overwritten (no accumulation); a null output pointer means "not wanted".
//   * Parameter gradients (sums over rows) are deterministic and independent of the thread count: the
//     rows are cut into chunks that depend only on R, each chunk sums into its own [C] partial, and the
//     partials are added in chunk order.
//   * Statistics stay finite for inputs whose squares overflow f32 (|x| > ~1e19): such a row is
//     recomputed scaled by 1/max|x| (only then: the common path pays nothing for it).
//   * The *_reference kernels are the naive double-precision versions, kept as the oracle for the fast
//     ones (STYLE.md: reference first, fast second, keep both). f32 only.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom::cpu {

// y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) per row (saved for the backward).
void rms_norm_forward(float* y, float* rstd, const float* x, const float* weight, int64_t rows, int64_t C,
                      float eps);
void rms_norm_forward(bf16* y, float* rstd, const bf16* x, const float* weight, int64_t rows, int64_t C,
                      float eps);
void rms_norm_forward(bf16* y, float* rstd, const float* x, const float* weight, int64_t rows, int64_t C,
                      float eps);

// With xhat = x * rstd and g = dy * weight:
//   dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum over rows of dy * xhat.
void rms_norm_backward(float* dx, float* dweight, const float* dy, const float* x, const float* weight,
                       const float* rstd, int64_t rows, int64_t C);
void rms_norm_backward(bf16* dx, float* dweight, const bf16* dy, const bf16* x, const float* weight,
                       const float* rstd, int64_t rows, int64_t C);

// The pre-norm residual step, fused: sum = x + residual (stored in T), y = rms_norm(sum) (stats in rstd).
void add_rms_norm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps);
void add_rms_norm_forward(bf16* sum, bf16* y, float* rstd, const bf16* x, const bf16* residual,
                          const float* weight, int64_t rows, int64_t C, float eps);
void add_rms_norm_forward(float* sum, bf16* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps);
// Its backward: dsum_total = dsum + (rms_norm's dx for dy at x = sum), the gradient of both x and
// residual; dweight as rms_norm_backward. dsum_total must not be null.
void add_rms_norm_backward(float* dsum_total, float* dweight, const float* dy, const float* dsum, const float* sum,
                           const float* weight, const float* rstd, int64_t rows, int64_t C);
void add_rms_norm_backward(bf16* dsum_total, float* dweight, const bf16* dy, const bf16* dsum, const bf16* sum,
                           const float* weight, const float* rstd, int64_t rows, int64_t C);

// y = (x - mean) * rstd * weight + bias with the biased variance (PyTorch's LayerNorm); bias may be null.
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps);
void layer_norm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps);
void layer_norm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps);

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum dy * xhat,  dbias = sum dy.
void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C);
void layer_norm_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C);

// ---- naive double-precision oracles --------------------------------------------------------------
void rms_norm_forward_reference(float* y, float* rstd, const float* x, const float* weight, int64_t rows,
                                int64_t C, float eps);
void rms_norm_backward_reference(float* dx, float* dweight, const float* dy, const float* x,
                                 const float* weight, int64_t rows, int64_t C, float eps);
void layer_norm_forward_reference(float* y, float* mean, float* rstd, const float* x, const float* weight,
                                  const float* bias, int64_t rows, int64_t C, float eps);
void layer_norm_backward_reference(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                                   const float* weight, int64_t rows, int64_t C, float eps);

}  // namespace loom::cpu
