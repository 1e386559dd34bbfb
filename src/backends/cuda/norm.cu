// RMSNorm and LayerNorm kernels (norm.h). Forward: one block per row. Backward: one block per chunk of rows, dx per
// row and a [C] partial of dweight per chunk, then a second kernel adding the partials in chunk order.
#include <cfloat>
#include <cmath>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/norm.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 32;

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
// dadd (nullable): added to dx before its one rounding (add_rms_norm's residual gradient, as the CPU's
// kAddGrad).
template <typename T>
__global__ void rms_norm_backward_kernel(T* dx, float* partial, const T* dy, const T* x, const float* weight,
                                         const float* rstd, int64_t rows, int64_t C, const T* dadd) {
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
        const float v = r * (load_f32(dyr, c) * weight[c] - xhat * dot);
        store_f32(dxr, c, dadd != nullptr ? v + load_f32(dadd + row * C, c) : v);
      }
    }
    if (part != nullptr) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) part[c] += load_f32(dyr, c) * load_f32(xr, c) * r;
    }
  }
}

// sum = x + residual, rounded once to T (the value the norm then reads, as on the CPU).
template <typename T>
__global__ void add_kernel(T* sum, const T* x, const T* residual, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    store_f32(sum, i, load_f32(x, i) + load_f32(residual, i));
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

// LayerNorm statistics of one row by the whole block, as the CPU's layer_norm_forward_impl: m = mean,
// then the corrected two-pass variance. Returns (m, c1, rs) with the saved mean m + c1.
template <typename T>
__device__ void layer_norm_stats(const T* xr, int64_t C, float eps, float* scratch, float& m, float& c1, float& rs) {
  const float inv_c = 1.0f / float(C);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += load_f32(xr, c);
  s = block_sum(s, scratch);
  m = s * inv_c;
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = load_f32(xr, c) - m;
    s1 += d;
    s2 += d * d;
  }
  s1 = block_sum(s1, scratch);
  s2 = block_sum(s2, scratch);
  c1 = s1 * inv_c;
  rs = 1.0f / sqrtf(fmaxf(0.0f, s2 * inv_c - c1 * c1) + eps);
  if (s2 <= FLT_MAX && fabsf(s) <= FLT_MAX) return;
  // Squares (or the sum) overflow: the statistics of x / max|x|, scaled back (cpu: scaled_layer_norm_stats;
  // the CPU drops the correction c1 on this path whether or not the rescue applies).
  c1 = 0.0f;
  float mx = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, fabsf(load_f32(xr, c)));
  mx = block_max(mx, scratch);
  if (!isfinite(mx) || mx == 0.0f) return;  // inf/NaN inputs: keep the unscaled (non-finite) stats
  const float inv = 1.0f / mx;
  float t = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) t += load_f32(xr, c) * inv;
  float ms = block_sum(t, scratch) * inv_c;
  float t1 = 0.0f, t2 = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = load_f32(xr, c) * inv - ms;
    t1 += d;
    t2 += d * d;
  }
  t1 = block_sum(t1, scratch);
  t2 = block_sum(t2, scratch);
  const float u1 = t1 * inv_c;
  const float var = fmaxf(0.0f, t2 * inv_c - u1 * u1);
  ms += u1;
  m = ms * mx;
  rs = inv / sqrtf(var + eps * inv * inv);
}

template <typename T>
__global__ void layer_norm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const float* weight,
                                          const float* bias, int64_t C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  float m, c1, rs;
  layer_norm_stats(xr, C, eps, scratch, m, c1, rs);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = m + c1;
    if (rstd != nullptr) rstd[row] = rs;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = ((load_f32(xr, c) - m) - c1) * rs * weight[c];
    store_f32(yr, c, bias != nullptr ? v + bias[c] : v);
  }
}

// partial_w, partial_b: [chunks, C] (either may be null), this block's row of each.
template <typename T>
__global__ void layer_norm_backward_kernel(T* dx, float* partial_w, float* partial_b, const T* dy, const T* x,
                                           const float* weight, const float* mean, const float* rstd, int64_t rows,
                                           int64_t C) {
  __shared__ float scratch[32];
  const float inv_c = 1.0f / float(C);
  const int64_t first = blockIdx.x * kRowsPerChunk;
  const int64_t last = min(rows, first + kRowsPerChunk);
  float* pw = partial_w != nullptr ? partial_w + blockIdx.x * C : nullptr;
  float* pb = partial_b != nullptr ? partial_b + blockIdx.x * C : nullptr;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (pw != nullptr) pw[c] = 0.0f;
    if (pb != nullptr) pb[c] = 0.0f;
  }
  for (int64_t row = first; row < last; ++row) {
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const float m = mean[row], rs = rstd[row];
    // The saved mean is rounded to f32; corr = mean(x - m) recovers the rest (as on the CPU).
    float sd = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sd += load_f32(xr, c) - m;
    sd = block_sum(sd, scratch);
    const float corr = isfinite(sd) ? sd * inv_c : 0.0f;
    if (dx != nullptr) {
      float sg = 0.0f, sgx = 0.0f;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = load_f32(dyr, c) * weight[c];
        sg += g;
        sgx += g * (((load_f32(xr, c) - m) - corr) * rs);
      }
      const float a = block_sum(sg, scratch) * inv_c;   // mean(g)
      const float b = block_sum(sgx, scratch) * inv_c;  // mean(g * xhat)
      T* dxr = dx + row * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float xhat = ((load_f32(xr, c) - m) - corr) * rs;
        store_f32(dxr, c, rs * (load_f32(dyr, c) * weight[c] - a - xhat * b));
      }
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = load_f32(dyr, c);
      if (pw != nullptr) pw[c] += g * (((load_f32(xr, c) - m) - corr) * rs);
      if (pb != nullptr) pb[c] += g;
    }
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
              const float* rstd, int64_t rows, int64_t C, const T* dadd = nullptr) {
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
                                                                                      rstd, rows, C, dadd);
  const cudaError_t launched = cudaGetLastError();
  if (launched == cudaSuccess && partial != nullptr) {
    sum_partials_kernel<<<grid_for(C, kThreads), kThreads, 0, ctx.stream>>>(dweight, partial, chunks, C);
  }
  if (partial != nullptr) allocator.deallocate(partial, partial_bytes);
  LOOM_CUDA_CHECK("rms_norm backward", launched);
  LOOM_CUDA_CHECK_LAUNCH("rms_norm backward");
}

template <typename T>
void add_forward(const Context& ctx, T* sum, T* y, float* rstd, const T* x, const T* residual, const float* weight,
                 int64_t rows, int64_t C, float eps) {
  if (rows == 0) return;
  {
    DeviceGuard guard(ctx.index, "add_rms_norm");
    add_kernel<<<grid_for(rows * C, kThreads), kThreads, 0, ctx.stream>>>(sum, x, residual, rows * C);
    LOOM_CUDA_CHECK_LAUNCH("add_rms_norm");
  }
  forward(ctx, y, rstd, static_cast<const T*>(sum), weight, rows, C, eps);
}

template <typename T>
void ln_forward(const Context& ctx, T* y, float* mean, float* rstd, const T* x, const float* weight, const float* bias,
                int64_t rows, int64_t C, float eps) {
  if (rows == 0) return;
  LOOM_CHECK(rows <= 0x7fffffff, "layer_norm: ", rows, " rows exceed one launch's grid");
  DeviceGuard guard(ctx.index, "layer_norm");
  layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, ctx.stream>>>(y, mean, rstd, x, weight, bias,
                                                                                      C, eps);
  LOOM_CUDA_CHECK_LAUNCH("layer_norm");
}

template <typename T>
void ln_backward(const Context& ctx, T* dx, float* dweight, float* dbias, const T* dy, const T* x, const float* weight,
                 const float* mean, const float* rstd, int64_t rows, int64_t C) {
  const char* op = "layer_norm backward";
  if (C == 0) return;
  DeviceGuard guard(ctx.index, op);
  if (rows == 0) {
    if (dweight != nullptr) LOOM_CUDA_CHECK(op, cudaMemsetAsync(dweight, 0, C * 4, ctx.stream));
    if (dbias != nullptr) LOOM_CUDA_CHECK(op, cudaMemsetAsync(dbias, 0, C * 4, ctx.stream));
    return;
  }
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  Allocator& allocator = device_allocator(ctx.index);
  const size_t bytes = static_cast<size_t>(chunks * C) * sizeof(float);
  float* pw = dweight != nullptr ? static_cast<float*>(allocator.allocate(bytes)) : nullptr;
  float* pb = dbias != nullptr ? static_cast<float*>(allocator.allocate(bytes)) : nullptr;
  layer_norm_backward_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, ctx.stream>>>(dx, pw, pb, dy, x, weight,
                                                                                         mean, rstd, rows, C);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && pw != nullptr) {
    sum_partials_kernel<<<grid_for(C, kThreads), kThreads, 0, ctx.stream>>>(dweight, pw, chunks, C);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && pb != nullptr) {
    sum_partials_kernel<<<grid_for(C, kThreads), kThreads, 0, ctx.stream>>>(dbias, pb, chunks, C);
    e = cudaGetLastError();
  }
  // Back to the cache right away: the stream orders any reuse after these kernels.
  if (pw != nullptr) allocator.deallocate(pw, bytes);
  if (pb != nullptr) allocator.deallocate(pb, bytes);
  LOOM_CUDA_CHECK(op, e);
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

void layer_norm_forward(const Context& ctx, float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps) {
  ln_forward(ctx, y, mean, rstd, x, weight, bias, rows, C, eps);
}
void layer_norm_forward(const Context& ctx, bf16* y, float* mean, float* rstd, const bf16* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps) {
  ln_forward(ctx, y, mean, rstd, x, weight, bias, rows, C, eps);
}
void layer_norm_backward(const Context& ctx, float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C) {
  ln_backward(ctx, dx, dweight, dbias, dy, x, weight, mean, rstd, rows, C);
}
void layer_norm_backward(const Context& ctx, bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C) {
  ln_backward(ctx, dx, dweight, dbias, dy, x, weight, mean, rstd, rows, C);
}

void add_rms_norm_forward(const Context& ctx, float* sum, float* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps) {
  add_forward(ctx, sum, y, rstd, x, residual, weight, rows, C, eps);
}
void add_rms_norm_forward(const Context& ctx, bf16* sum, bf16* y, float* rstd, const bf16* x, const bf16* residual,
                          const float* weight, int64_t rows, int64_t C, float eps) {
  add_forward(ctx, sum, y, rstd, x, residual, weight, rows, C, eps);
}
void add_rms_norm_backward(const Context& ctx, float* dsum_total, float* dweight, const float* dy, const float* dsum,
                           const float* sum, const float* weight, const float* rstd, int64_t rows, int64_t C) {
  backward(ctx, dsum_total, dweight, dy, sum, weight, rstd, rows, C, dsum);
}
void add_rms_norm_backward(const Context& ctx, bf16* dsum_total, float* dweight, const bf16* dy, const bf16* dsum,
                           const bf16* sum, const float* weight, const float* rstd, int64_t rows, int64_t C) {
  backward(ctx, dsum_total, dweight, dy, sum, weight, rstd, rows, C, dsum);
}

}  // namespace loom::cuda
