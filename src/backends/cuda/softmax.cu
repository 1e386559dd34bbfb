// Softmax kernels (softmax.h). inner == 1: one block per row, block reductions for the max and the sum.
// inner > 1: one thread per (outer, inner) column walking n with stride inner (such layouts are rare:
// softmax over a non-last dimension). Every reduction has a fixed order, so results repeat bit for bit;
// expf differs from the CPU's polynomial exp in the last bits, so CPU and GPU agree to ~1e-6 relative.
#include <cmath>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/softmax.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void softmax_rows_kernel(float* y, const float* x, int64_t n) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m, scratch);
  if (m == -INFINITY) {  // nothing to attend to: zeros, not (-inf) - (-inf) = NaN
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = 0.0f;
    return;
  }
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
  s = block_sum(s, scratch);
  const float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

__global__ void softmax_rows_backward_kernel(float* dx, const float* y, const float* dy, int64_t n) {
  __shared__ float scratch[32];
  const float* yr = y + blockIdx.x * n;
  const float* gr = dy + blockIdx.x * n;
  float* dr = dx + blockIdx.x * n;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += yr[j] * gr[j];
  dot = block_sum(dot, scratch);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dr[j] = yr[j] * (gr[j] - dot);
}

__global__ void softmax_columns_kernel(float* y, const float* x, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < outer * inner;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * n * inner + k % inner;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[base + j * inner]);
    if (m == -INFINITY) m = 0.0f;  // all -inf: e^(-inf - 0) = 0 below, and the sum stays 0
    float s = 0.0f;
    for (int64_t j = 0; j < n; ++j) s += expf(x[base + j * inner] - m);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t j = 0; j < n; ++j) y[base + j * inner] = expf(x[base + j * inner] - m) * inv;
  }
}

__global__ void softmax_columns_backward_kernel(float* dx, const float* y, const float* dy, int64_t outer, int64_t n,
                                                int64_t inner) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < outer * inner;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * n * inner + k % inner;
    float dot = 0.0f;
    for (int64_t j = 0; j < n; ++j) dot += y[base + j * inner] * dy[base + j * inner];
    for (int64_t j = 0; j < n; ++j) dx[base + j * inner] = y[base + j * inner] * (dy[base + j * inner] - dot);
  }
}

}  // namespace

void softmax_forward(const Context& ctx, float* y, const float* x, int64_t outer, int64_t n, int64_t inner) {
  if (outer == 0 || n == 0 || inner == 0) return;
  DeviceGuard guard(ctx.index, "softmax");
  if (inner == 1) {
    LOOM_CHECK(outer <= 0x7fffffff, "softmax: ", outer, " rows exceed one launch's grid");
    softmax_rows_kernel<<<unsigned(outer), kThreads, 0, ctx.stream>>>(y, x, n);
  } else {
    softmax_columns_kernel<<<grid_for(outer * inner, kThreads), kThreads, 0, ctx.stream>>>(y, x, outer, n, inner);
  }
  LOOM_CUDA_CHECK_LAUNCH("softmax");
}

void softmax_backward(const Context& ctx, float* dx, const float* y, const float* dy, int64_t outer, int64_t n,
                      int64_t inner) {
  if (outer == 0 || n == 0 || inner == 0) return;
  DeviceGuard guard(ctx.index, "softmax backward");
  if (inner == 1) {
    LOOM_CHECK(outer <= 0x7fffffff, "softmax backward: ", outer, " rows exceed one launch's grid");
    softmax_rows_backward_kernel<<<unsigned(outer), kThreads, 0, ctx.stream>>>(dx, y, dy, n);
  } else {
    softmax_columns_backward_kernel<<<grid_for(outer * inner, kThreads), kThreads, 0, ctx.stream>>>(dx, y, dy, outer,
                                                                                                   n, inner);
  }
  LOOM_CUDA_CHECK_LAUNCH("softmax backward");
}

}  // namespace loom::cuda
