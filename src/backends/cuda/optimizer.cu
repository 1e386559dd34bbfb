// Optimizer kernels (optimizer.h). AdamW is one grid-stride pass (memory bound: 4 f32 reads, 3 writes
// per element, 2 more bytes with the bf16 copy); one launch per parameter tensor. On an H200 clip + AdamW
// took 4 ms of GPT-2 small's 123 ms bf16 step (docs/cuda.md), so a multi-tensor launch can wait.
#include <cmath>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/optimizer.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = 256;  // fixed, so the partials (and the result's bits) do not depend on the GPU

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, float decay,
                             float beta1, float beta2, float step_size, float bc2_sqrt, float eps, uint16_t* copy) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    float p = param[i] * decay;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    param[i] = p;
    if (copy != nullptr) copy[i] = float_to_bf16(p);
  }
}

// partial[block] = the block's sum over its fixed slice of [0, n); slices are contiguous ranges.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double lanes[kThreads];
  const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per_block, end = min(n, begin + per_block);
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += double(x[i]) * double(x[i]);
  lanes[threadIdx.x] = s;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) lanes[threadIdx.x] += lanes[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = lanes[0];
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0.0;
  for (int k = 0; k < count; ++k) s += partial[k];
  *out += s;
}

}  // namespace

void adamw_update(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, double bias_correction1,
                  double bias_correction2, bf16* param_bf16) {
  if (n == 0) return;
  // The scalars exactly as cpu::adamw_update computes them.
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  DeviceGuard guard(ctx.index, "AdamW");
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(param, grad, m, v, n, decay, beta1, beta2,
                                                                   step_size, bc2_sqrt, eps,
                                                                   reinterpret_cast<uint16_t*>(param_bf16));
  LOOM_CUDA_CHECK_LAUNCH("AdamW");
}

void add_sum_of_squares(const Context& ctx, double* out, const float* x, int64_t n) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "global_grad_norm");
  Allocator& allocator = device_allocator(ctx.index);
  auto* partial = static_cast<double*>(allocator.allocate(kSumBlocks * sizeof(double)));
  sum_squares_partial_kernel<<<kSumBlocks, kThreads, 0, ctx.stream>>>(partial, x, n);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    sum_partials_kernel<<<1, 1, 0, ctx.stream>>>(out, partial, kSumBlocks);
    e = cudaGetLastError();
  }
  allocator.deallocate(partial, kSumBlocks * sizeof(double));  // the stream orders any reuse
  LOOM_CUDA_CHECK("global_grad_norm", e);
}

}  // namespace loom::cuda
