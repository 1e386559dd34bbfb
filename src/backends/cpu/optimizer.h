// CPU kernels for optimizer updates. n is the parameter's element count.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom::cpu {

// One AdamW step on a parameter, in PyTorch's order of operations (torch.optim.AdamW, single-tensor):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - b_i^step.
// param_bf16 (optional): also written, the updated param rounded to bf16 (convert_f32_to_bf16's
// rounding), in the same pass: each block of 1024 elements is converted while it is still in L1, so
// mixed-precision training needs no separate f32 -> bf16 pass over the weights. param, m and v are the
// same bits with or without it.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, double bias_correction1, double bias_correction2,
                  bf16* param_bf16 = nullptr);
// The oracle: one thread, one element at a time, the same formula; param_bf16 via bf16::from_float.
void adamw_update_reference(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, double bias_correction1,
                            double bias_correction2, bf16* param_bf16 = nullptr);

// Sum of squares in double, in a fixed order (independent of thread count).
double sum_of_squares(const float* x, int64_t n);

}  // namespace loom::cpu
