// Element-wise kernels (elementwise.h): grid-stride loops, one element per thread per step. Memory
// bound; the H200 runs put them at a few ms of a step (docs/cuda.md); fusing them into GEMM epilogues
// would save more than vectorising them.
#include <algorithm>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/elementwise.h"
#include "backends/row_sums.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, typename F>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    store_f32(out, i, f(load_f32(a, i), load_f32(b, i)));
  }
}

template <typename Out, typename In>
__global__ void convert_kernel(Out* out, const In* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    store_f32(out, i, load_f32(in, i));
  }
}

// partial[b, n] = rows [b K, (b + 1) K) of column n added in order from 0 (K = kRowSumBlock).
__global__ void sum_row_blocks_kernel(const float* x, int64_t M, int64_t N, int64_t blocks, float* partial) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const int64_t m0 = b * kRowSumBlock, m1 = m0 + kRowSumBlock < M ? m0 + kRowSumBlock : M;
    float s = 0.0f;
    for (int64_t m = m0; m < m1; ++m) s += x[m * N + n];
    partial[b * N + n] = s;
  }
}

// out[n] = the blocks' sums added in order from 0.
__global__ void sum_partials_kernel(const float* partial, int64_t blocks, int64_t N, float* out) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * N + n];
  out[n] = s;
}

struct Add {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct Mul {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct Scale {
  float s;
  __device__ float operator()(float x, float) const { return x * s; }
};

template <typename T, typename F>
void launch_map2(const char* op, const Context& ctx, T* out, const T* a, const T* b, int64_t n, F f) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, op);
  map2_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, a, b, n, f);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

void add_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t n) {
  launch_map2("add", ctx, out, a, b, n, Add{});
}
void add_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t n) {
  launch_map2("add", ctx, out, a, b, n, Add{});
}
void add_inplace(const Context& ctx, float* out, const float* b, int64_t n) {
  launch_map2("add_", ctx, out, out, b, n, Add{});
}
void mul_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t n) {
  launch_map2("mul", ctx, out, a, b, n, Mul{});
}
void scale_forward(const Context& ctx, float* out, const float* a, float s, int64_t n) {
  launch_map2("scale", ctx, out, a, a, n, Scale{s});
}

void sum_rows(const Context& ctx, const float* x, int64_t M, int64_t N, float* out) {
  if (N == 0) return;
  const char* op = "sum_rows";
  DeviceGuard guard(ctx.index, op);
  const int64_t blocks = (M + kRowSumBlock - 1) / kRowSumBlock;
  const unsigned columns = unsigned((N + kThreads - 1) / kThreads);
  Allocator& allocator = device_allocator(ctx.index);
  const size_t bytes = size_t(std::max<int64_t>(blocks, 1) * N) * sizeof(float);
  auto* partial = static_cast<float*>(allocator.allocate(bytes));
  cudaError_t e = cudaSuccess;
  if (blocks > 0) {
    sum_row_blocks_kernel<<<dim3(columns, unsigned(std::min<int64_t>(blocks, 65535))), kThreads, 0, ctx.stream>>>(
        x, M, N, blocks, partial);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    sum_partials_kernel<<<columns, kThreads, 0, ctx.stream>>>(partial, blocks, N, out);
    e = cudaGetLastError();
  }
  allocator.deallocate(partial, bytes);  // the stream orders any reuse after these kernels
  LOOM_CUDA_CHECK(op, e);
}

void convert_f32_to_bf16(const Context& ctx, bf16* out, const float* in, int64_t n) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "to(bf16)");
  convert_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, in, n);
  LOOM_CUDA_CHECK_LAUNCH("to(bf16)");
}
void convert_bf16_to_f32(const Context& ctx, float* out, const bf16* in, int64_t n) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "to(f32)");
  convert_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, in, n);
  LOOM_CUDA_CHECK_LAUNCH("to(f32)");
}

}  // namespace loom::cuda
