// Dropout kernel (activation.h): one thread per element, each drawing its own Philox word (a block of
// four words is computed per element, 4x the CPU's work, which is nothing next to the memory traffic).
#include <cmath>

#include "backends/cuda/activation.h"
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void dropout_kernel(T* y, const T* x, int64_t n, uint32_t k0, uint32_t k1, uint32_t threshold, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(x, i) * scale;
    store_f32(y, i, keep_element(k0, k1, static_cast<uint64_t>(i), threshold) ? v : 0.0f);
  }
}

template <typename T>
void dropout(const Context& ctx, T* y, const T* x, int64_t n, float p, RngKey key) {
  LOOM_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got p=", p);
  if (n == 0) return;
  // cpu::philox::drop_threshold: ceil(p * 2^24) in double.
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  const float scale = 1.0f / (1.0f - p);
  DeviceGuard guard(ctx.index, "dropout");
  dropout_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(y, x, n, key.k0, key.k1, threshold, scale);
  LOOM_CUDA_CHECK_LAUNCH("dropout");
}

}  // namespace

void dropout_forward(const Context& ctx, float* y, const float* x, int64_t n, float p, RngKey key) {
  dropout(ctx, y, x, n, p, key);
}
void dropout_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n, float p, RngKey key) {
  dropout(ctx, y, x, n, p, key);
}

}  // namespace loom::cuda
