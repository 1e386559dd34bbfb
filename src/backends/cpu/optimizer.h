// CPU kernels for optimizer updates. n is the parameter's element count.
#pragma once

#include <cstdint>

namespace loom::cpu {

// One AdamW step on a parameter, in PyTorch's order of operations (torch.optim.AdamW, single-tensor):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - b_i^step.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, double bias_correction1, double bias_correction2);

// Sum of squares in double, in a fixed order (independent of thread count).
double sum_of_squares(const float* x, int64_t n);

}  // namespace loom::cpu
