// Cross-entropy kernels (loss.h). One block per row: a max pass, a sum of exponentials, then the
// gradient pass recomputing each exponential (reading the row three times keeps no [V] scratch, and a
// V = 50257 row is in L2 anyway). expf is the GPU's, not the CPU's polynomial: the two agree to ~1e-6.
#include <cfloat>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/loss.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// One block: count[0] = #targets != ignore_index (an exact integer sum, so any order is the same).
__global__ void count_targets_kernel(int64_t* count, const int32_t* targets, int64_t N, int32_t ignore_index) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned long long c = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) c += targets[n] != ignore_index ? 1 : 0;
  atomicAdd(&total, c);
  __syncthreads();
  if (threadIdx.x == 0) *count = static_cast<int64_t>(total);
}

__global__ void cross_entropy_rows_kernel(double* row_loss, float* grad, const float* logits, const int32_t* targets,
                                          int64_t V, int64_t ld, int32_t ignore_index, const int64_t* count) {
  __shared__ float scratch[32];
  const int64_t n = blockIdx.x;
  const float* x = logits + n * ld;
  float* g = grad != nullptr ? grad + n * ld : nullptr;
  const int32_t t = targets[n];
  if (t == ignore_index || t < 0 || t >= V) {
    if (g != nullptr) {
      for (int64_t i = threadIdx.x; i < V; i += blockDim.x) g[i] = 0.0f;
    }
    if (threadIdx.x == 0) row_loss[n] = 0.0;
    return;
  }
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - m);
  s = block_sum(s, scratch);
  const float xt = x[t];  // read before the gradient pass may overwrite it (grad == logits)
  __syncthreads();
  if (threadIdx.x == 0) row_loss[n] = double(m) + log(double(s)) - double(xt);
  if (g != nullptr) {
    const float scale = *count > 0 ? 1.0f / float(*count) : 0.0f;
    const float k = scale / s;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float e = expf(x[i] - m);
      g[i] = i == t ? e * k - scale : e * k;
    }
  }
}

// One block; each thread sums a strided slice, then a fixed tree: the same bits every run.
__global__ void mean_loss_kernel(float* loss, const double* row_loss, int64_t N, const int64_t* count) {
  __shared__ double partial[kThreads];
  double s = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += row_loss[n];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = *count > 0 ? float(partial[0] / double(*count)) : 0.0f;
}

__global__ void scale_by_kernel(float* x, const float* s, int64_t n) {
  const float k = *s;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] *= k;
  }
}

}  // namespace

void count_targets(const Context& ctx, int64_t* count, const int32_t* targets, int64_t N, int32_t ignore_index) {
  DeviceGuard guard(ctx.index, "cross_entropy");
  count_targets_kernel<<<1, 1024, 0, ctx.stream>>>(count, targets, N, ignore_index);
  LOOM_CUDA_CHECK_LAUNCH("cross_entropy");
}

void cross_entropy_rows(const Context& ctx, double* row_loss, float* grad, const float* logits, const int32_t* targets,
                        int64_t N, int64_t V, int32_t ignore_index, const int64_t* count, int64_t ld) {
  if (N == 0) return;
  LOOM_CHECK(N <= 0x7fffffff, "cross_entropy: ", N, " rows exceed one launch's grid");
  LOOM_CHECK(ld == 0 || ld >= V, "cross_entropy: row stride ", ld, " is below V=", V);
  DeviceGuard guard(ctx.index, "cross_entropy");
  cross_entropy_rows_kernel<<<unsigned(N), kThreads, 0, ctx.stream>>>(row_loss, grad, logits, targets, V,
                                                                       ld == 0 ? V : ld, ignore_index, count);
  LOOM_CUDA_CHECK_LAUNCH("cross_entropy");
}

void mean_loss(const Context& ctx, float* loss, const double* row_loss, int64_t N, const int64_t* count) {
  DeviceGuard guard(ctx.index, "cross_entropy");
  mean_loss_kernel<<<1, kThreads, 0, ctx.stream>>>(loss, row_loss, N, count);
  LOOM_CUDA_CHECK_LAUNCH("cross_entropy");
}

void scale_by(const Context& ctx, float* x, const float* s, int64_t n) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "cross_entropy backward");
  scale_by_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(x, s, n);
  LOOM_CUDA_CHECK_LAUNCH("cross_entropy backward");
}

}  // namespace loom::cuda
