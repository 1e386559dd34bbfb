// Element-wise kernels (elementwise.h): grid-stride loops, one element per thread per step. Memory
// bound; vectorised 16-byte access is the next step once a GPU run has timed these.
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/elementwise.h"

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

__global__ void sum_rows_kernel(const float* x, int64_t M, int64_t N, float* out) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int64_t m = 0; m < M; ++m) s += x[m * N + n];
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
  DeviceGuard guard(ctx.index, "sum_rows");
  sum_rows_kernel<<<unsigned((N + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(x, M, N, out);
  LOOM_CUDA_CHECK_LAUNCH("sum_rows");
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
