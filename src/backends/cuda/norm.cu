// RMSNorm kernels (norm.h). Forward: one block per row. Backward: one block per chunk of rows, dx per
// row and a [C] partial of dweight per chunk, then a second kernel adding the partials in chunk order.
#include <cmath>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/norm.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 32;

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x % 32 < blockDim.x / 32 ? scratch[threadIdx.x % 32] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// 1 / sqrt(mean(x^2) + eps) of one row, by the whole block. A row whose squares overflow f32 is
// summed again scaled by 1/max|x| (as the CPU kernel does), so the statistic stays finite.
template <typename T>
__device__ float row_rstd(const T* xr, int64_t C, float eps, float* scratch) {
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = load_f32(xr, c);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  if (isfinite(ss)) return 1.0f / sqrtf(ss / float(C) + eps);
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, fabsf(load_f32(xr, c)));
  m = block_max(m, scratch);
  if (!isfinite(m)) return 0.0f * m;  // inf or NaN in the row: NaN, as the CPU gives
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = load_f32(xr, c) / m;
    s += v * v;
  }
  s = block_sum(s, scratch);
  return 1.0f / (m * sqrtf(s / float(C) + eps / (m * m)));
}

template <typename T>
__global__ void rms_norm_forward_kernel(T* y, float* rstd, const T* x, const float* weight, int64_t C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  const float r = row_rstd(xr, C, eps, scratch);
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_f32(yr, c, load_f32(xr, c) * r * weight[c]);
}

// partial: [chunks, C], this block's row of it accumulated by the thread owning each column.
template <typename T>
__global__ void rms_norm_backward_kernel(T* dx, float* partial, const T* dy, const T* x, const float* weight,
                                         const float* rstd, int64_t rows, int64_t C) {
  __shared__ float scratch[32];
  const int64_t first = blockIdx.x * kRowsPerChunk;
  const int64_t last = min(rows, first + kRowsPerChunk);
  float* part = partial != nullptr ? partial + blockIdx.x * C : nullptr;
  if (part != nullptr) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) part[c] = 0.0f;
  }
  for (int64_t row = first; row < last; ++row) {
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const float r = rstd[row];
    if (dx != nullptr) {
      float dot = 0.0f;  // sum of g * xhat
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load_f32(dyr, c) * weight[c] * load_f32(xr, c) * r;
      dot = block_sum(dot, scratch) / float(C);
      T* dxr = dx + row * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float xhat = load_f32(xr, c) * r;
        store_f32(dxr, c, r * (load_f32(dyr, c) * weight[c] - xhat * dot));
      }
    }
    if (part != nullptr) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) part[c] += load_f32(dyr, c) * load_f32(xr, c) * r;
    }
  }
}

// dweight[c] = sum over chunks, in chunk order, of partial[chunk, c].
__global__ void sum_partials_kernel(float* dweight, const float* partial, int64_t chunks, int64_t C) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
    dweight[c] = s;
  }
}

template <typename T>
void forward(const Context& ctx, T* y, float* rstd, const T* x, const float* weight, int64_t rows, int64_t C, float eps) {
  if (rows == 0) return;
  LOOM_CHECK(rows <= 0x7fffffff, "rms_norm: ", rows, " rows exceed one launch's grid");
  DeviceGuard guard(ctx.index, "rms_norm");
  rms_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, ctx.stream>>>(y, rstd, x, weight, C, eps);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm");
}

template <typename T>
void backward(const Context& ctx, T* dx, float* dweight, const T* dy, const T* x, const float* weight,
              const float* rstd, int64_t rows, int64_t C) {
  if (C == 0) return;
  DeviceGuard guard(ctx.index, "rms_norm backward");
  if (rows == 0) {
    if (dweight != nullptr) LOOM_CUDA_CHECK("rms_norm backward", cudaMemsetAsync(dweight, 0, C * 4, ctx.stream));
    return;
  }
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  // The partials come from the device's caching allocator and go back to it right after the launches:
  // the stream orders the reuse.
  Allocator& allocator = device_allocator(ctx.index);
  const size_t partial_bytes = dweight != nullptr ? static_cast<size_t>(chunks * C) * sizeof(float) : 0;
  float* partial = partial_bytes ? static_cast<float*>(allocator.allocate(partial_bytes)) : nullptr;
  rms_norm_backward_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, ctx.stream>>>(dx, partial, dy, x, weight,
                                                                                      rstd, rows, C);
  const cudaError_t launched = cudaGetLastError();
  if (launched == cudaSuccess && partial != nullptr) {
    sum_partials_kernel<<<grid_for(C, kThreads), kThreads, 0, ctx.stream>>>(dweight, partial, chunks, C);
  }
  if (partial != nullptr) allocator.deallocate(partial, partial_bytes);
  LOOM_CUDA_CHECK("rms_norm backward", launched);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm backward");
}

}  // namespace

void rms_norm_forward(const Context& ctx, float* y, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t C, float eps) {
  forward(ctx, y, rstd, x, weight, rows, C, eps);
}
void rms_norm_forward(const Context& ctx, bf16* y, float* rstd, const bf16* x, const float* weight, int64_t rows,
                      int64_t C, float eps) {
  forward(ctx, y, rstd, x, weight, rows, C, eps);
}
void rms_norm_backward(const Context& ctx, float* dx, float* dweight, const float* dy, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t C) {
  backward(ctx, dx, dweight, dy, x, weight, rstd, rows, C);
}
void rms_norm_backward(const Context& ctx, bf16* dx, float* dweight, const bf16* dy, const bf16* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t C) {
  backward(ctx, dx, dweight, dy, x, weight, rstd, rows, C);
}

}  // namespace loom::cuda
