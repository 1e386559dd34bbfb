// CUDA kernels for the optimizer: the contracts of backends/cpu/optimizer.h on device memory, queued on
// ctx's stream. n is the parameter's element count.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

// One fused AdamW step on an f32 master parameter, element by element in cpu::adamw_update's order of
// operations (PyTorch's). When param_bf16 is not null it also receives the updated parameter rounded to
// bf16 (the copy bf16 GEMMs read), in the same pass.
void adamw_update(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, double bias_correction1,
                  double bias_correction2, bf16* param_bf16 = nullptr);

// *out (device) += sum of x[i]^2 in double, in a fixed order (fixed blocks of the grid, then the blocks'
// partials in order): the same bits every run. Chaining calls over several tensors into one `out` gives
// the squared global norm without a read-back per tensor.
void add_sum_of_squares(const Context& ctx, double* out, const float* x, int64_t n);

}  // namespace loom::cuda
