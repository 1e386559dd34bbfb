// Activation kernels (activation.h): grid-stride loops, one element per thread per step. Dropout draws
// each element's own Philox word (a block of four words is computed per element, 4x the CPU's work, which
// is nothing next to the memory traffic).
#include <cmath>

#include "backends/cuda/activation.h"
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluTanhCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}
__device__ __forceinline__ float gelu_value(float x, bool tanh_approximation) {
  if (tanh_approximation) return x * sigmoid(2.0f * kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x));
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}
__device__ __forceinline__ float gelu_grad(float x, bool tanh_approximation) {
  if (tanh_approximation) {
    const float xc = x < -20.0f ? -20.0f : (x > 20.0f ? 20.0f : x);  // as the CPU: no inf * 0 for huge |x|
    const float s = sigmoid(2.0f * kSqrt2OverPi * (xc + kGeluTanhCubic * xc * xc * xc));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * xc * xc);
    return s + 2.0f * xc * s * (1.0f - s) * du;
  }
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

// kind: 0 silu, 1 gelu, 2 gelu (tanh).
template <typename T>
__global__ void act_forward_kernel(T* y, const T* x, int64_t n, int kind) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(x, i);
    store_f32(y, i, kind == 0 ? v * sigmoid(v) : gelu_value(v, kind == 2));
  }
}

template <typename T>
__global__ void act_backward_kernel(T* dx, const T* dy, const T* x, int64_t n, int kind) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(x, i);
    store_f32(dx, i, load_f32(dy, i) * (kind == 0 ? silu_grad(v) : gelu_grad(v, kind == 2)));
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* y, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate, i);
    store_f32(y, i, g * sigmoid(g) * load_f32(up, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate, i), s = sigmoid(g), d = load_f32(dy, i);
    if (dgate != nullptr) store_f32(dgate, i, d * load_f32(up, i) * s * (1.0f + g * (1.0f - s)));
    if (dup != nullptr) store_f32(dup, i, d * g * s);
  }
}

template <typename T>
void act_forward(const Context& ctx, T* y, const T* x, int64_t n, int kind, const char* op) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, op);
  act_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(y, x, n, kind);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void act_backward(const Context& ctx, T* dx, const T* dy, const T* x, int64_t n, int kind, const char* op) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, op);
  act_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(dx, dy, x, n, kind);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void swiglu_fwd(const Context& ctx, T* y, const T* gate, const T* up, int64_t n) {
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "swiglu");
  swiglu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(y, gate, up, n);
  LOOM_CUDA_CHECK_LAUNCH("swiglu");
}

template <typename T>
void swiglu_bwd(const Context& ctx, T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  if (n == 0 || (dgate == nullptr && dup == nullptr)) return;
  DeviceGuard guard(ctx.index, "swiglu backward");
  swiglu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(dgate, dup, dy, gate, up, n);
  LOOM_CUDA_CHECK_LAUNCH("swiglu backward");
}

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

void silu_forward(const Context& ctx, float* y, const float* x, int64_t n) { act_forward(ctx, y, x, n, 0, "silu"); }
void silu_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n) { act_forward(ctx, y, x, n, 0, "silu"); }
void silu_backward(const Context& ctx, float* dx, const float* dy, const float* x, int64_t n) {
  act_backward(ctx, dx, dy, x, n, 0, "silu backward");
}
void silu_backward(const Context& ctx, bf16* dx, const bf16* dy, const bf16* x, int64_t n) {
  act_backward(ctx, dx, dy, x, n, 0, "silu backward");
}
void gelu_forward(const Context& ctx, float* y, const float* x, int64_t n, bool tanh_approximation) {
  act_forward(ctx, y, x, n, tanh_approximation ? 2 : 1, "gelu");
}
void gelu_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n, bool tanh_approximation) {
  act_forward(ctx, y, x, n, tanh_approximation ? 2 : 1, "gelu");
}
void gelu_backward(const Context& ctx, float* dx, const float* dy, const float* x, int64_t n, bool tanh_approximation) {
  act_backward(ctx, dx, dy, x, n, tanh_approximation ? 2 : 1, "gelu backward");
}
void gelu_backward(const Context& ctx, bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approximation) {
  act_backward(ctx, dx, dy, x, n, tanh_approximation ? 2 : 1, "gelu backward");
}
void swiglu_forward(const Context& ctx, float* y, const float* gate, const float* up, int64_t n) {
  swiglu_fwd(ctx, y, gate, up, n);
}
void swiglu_forward(const Context& ctx, bf16* y, const bf16* gate, const bf16* up, int64_t n) {
  swiglu_fwd(ctx, y, gate, up, n);
}
void swiglu_backward(const Context& ctx, float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                     int64_t n) {
  swiglu_bwd(ctx, dgate, dup, dy, gate, up, n);
}
void swiglu_backward(const Context& ctx, bf16* dgate, bf16* dup, const bf16* dy, const bf16* gate, const bf16* up,
                     int64_t n) {
  swiglu_bwd(ctx, dgate, dup, dy, gate, up, n);
}

}  // namespace loom::cuda
