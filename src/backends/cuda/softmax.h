// CUDA kernels for softmax: the contracts of backends/cpu/softmax.h on device memory, queued on ctx's
// stream. softmax runs over the middle axis of a contiguous [outer, n, inner] view (inner == 1: the last
// dimension). A row that is entirely -inf gives zeros (not NaN), as on the CPU.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

void softmax_forward(const Context& ctx, float* y, const float* x, int64_t outer, int64_t n, int64_t inner);
// dx = y * (dy - sum_n(dy * y)).
void softmax_backward(const Context& ctx, float* dx, const float* y, const float* dy, int64_t outer, int64_t n,
                      int64_t inner);

}  // namespace loom::cuda
