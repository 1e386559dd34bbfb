// MLA head-layout kernels (mla.h): one thread per copied value or rotated pair. Each pair's arithmetic is
// cpu::rope_rotate_row's (x0*c - x1*s, x0*s + x1*c, s negated for the inverse) with no FMA contraction
// (__fmul_rn/__fadd_rn), and the rope-key gradient sums the heads in head order, so with the same tables
// the outputs are the CPU's.
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/mla.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// Rotates pair i of a P-vector: out[i], out[i + half] from x0 = in[i], x1 = in[i + half].
__device__ __forceinline__ void rotate_pair(float* out, float x0, float x1, float c, float s, int64_t i, int64_t half) {
  out[i] = __fadd_rn(__fmul_rn(x0, c), -__fmul_rn(x1, s));
  out[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// One thread per (b, h, t, j), j in [0, N + P/2): j < N copies, else rotates pair j - N.
__global__ void query_heads_kernel(const float* src, float* dst, const float* cos, const float* sin, int64_t B,
                                   int64_t T, int64_t H, int64_t N, int64_t P, bool per_batch, bool backward) {
  const int64_t half = P / 2, J = N + half, D = N + P;
  const int64_t n = B * H * T * J;
  const float sign = backward ? -1.0f : 1.0f;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = k % J, t = (k / J) % T, r = k / (J * T);  // r = b * H + h
    const int64_t b = r / H, h = r % H;
    const int64_t heads = (r * T + t) * D;          // offset in [B, H, T, D]
    const int64_t rows = ((b * T + t) * H + h) * D;  // offset in [B, T, H, D]
    const float* in = src + (backward ? heads : rows);
    float* out = dst + (backward ? rows : heads);
    if (j < N) {
      out[j] = in[j];
    } else {
      const int64_t i = j - N, row = per_batch ? b * T + t : t;
      const float c = cos[row * half + i], s = sign * sin[row * half + i];
      rotate_pair(out + N, in[N + i], in[N + i + half], c, s, i, half);
    }
  }
}

// One thread per (b, h, s, j), j in [0, N + P/2 + Dv): k_nope copies, rotated key pairs, v copies.
__global__ void key_value_heads_kernel(const float* kv, const float* kr, const float* cos, const float* sin, int64_t B,
                                       int64_t S, int64_t H, int64_t N, int64_t P, int64_t Dv, bool per_batch,
                                       float* k, float* v) {
  const int64_t half = P / 2, J = N + half + Dv, D = N + P, W = N + Dv;
  const int64_t n = B * H * S * J;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = x % J, s = (x / J) % S, r = x / (J * S);  // r = b * H + h
    const int64_t b = r / H, h = r % H;
    const float* in = kv + ((b * S + s) * H + h) * W;
    if (j < N) {
      k[(r * S + s) * D + j] = in[j];
    } else if (j < N + half) {
      const int64_t i = j - N, row = per_batch ? b * S + s : s;
      const float* rope_in = kr + (b * S + s) * P;
      rotate_pair(k + (r * S + s) * D + N, rope_in[i], rope_in[i + half], cos[row * half + i], sin[row * half + i], i,
                  half);
    } else {
      const int64_t i = j - N - half;
      v[(r * S + s) * Dv + i] = in[N + i];
    }
  }
}

// dkv_b: one thread per element of [B, S, H, W].
__global__ void key_value_grad_kernel(const float* dk, const float* dv, int64_t B, int64_t S, int64_t H, int64_t N,
                                      int64_t P, int64_t Dv, float* dkv) {
  const int64_t D = N + P, W = N + Dv;
  const int64_t n = B * S * H * W;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = x % W, h = (x / W) % H, bs = x / (W * H);  // bs = b * S + s
    const int64_t b = bs / S, s = bs % S;
    const int64_t head_row = (b * H + h) * S + s;
    dkv[x] = j < N ? dk[head_row * D + j] : dv[head_row * Dv + (j - N)];
  }
}

// dk_rope: one thread per (b, s, pair i): both values of the pair summed over the heads in head order,
// then rotated back.
__global__ void rope_key_grad_kernel(const float* dk, const float* cos, const float* sin, int64_t B, int64_t S,
                                     int64_t H, int64_t N, int64_t P, bool per_batch, float* dr) {
  const int64_t half = P / 2, D = N + P;
  const int64_t n = B * S * half;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = x % half, bs = x / half, b = bs / S, s = bs % S;
    float x0 = 0.0f, x1 = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      const float* g = dk + ((b * H + h) * S + s) * D + N;
      x0 = h == 0 ? g[i] : __fadd_rn(x0, g[i]);
      x1 = h == 0 ? g[i + half] : __fadd_rn(x1, g[i + half]);
    }
    const int64_t row = per_batch ? bs : s;
    rotate_pair(dr + bs * P, x0, x1, cos[row * half + i], -sin[row * half + i], i, half);
  }
}

}  // namespace

void mla_query_heads(const Context& ctx, const float* src, float* dst, const float* cos, const float* sin, int64_t B,
                     int64_t T, int64_t H, int64_t N, int64_t P, bool per_batch, bool backward) {
  const char* op = backward ? "mla_query_heads backward" : "mla_query_heads";
  const int64_t n = B * H * T * (N + P / 2);
  if (n == 0) return;
  DeviceGuard guard(ctx.index, op);
  query_heads_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(src, dst, cos, sin, B, T, H, N, P, per_batch,
                                                                         backward);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void mla_key_value_heads_forward(const Context& ctx, const float* kv_b, const float* k_rope, const float* cos,
                                 const float* sin, int64_t B, int64_t S, int64_t H, int64_t N, int64_t P, int64_t Dv,
                                 bool per_batch, float* k, float* v) {
  const char* op = "mla_key_value_heads";
  const int64_t n = B * H * S * (N + P / 2 + Dv);
  if (n == 0) return;
  DeviceGuard guard(ctx.index, op);
  key_value_heads_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(kv_b, k_rope, cos, sin, B, S, H, N, P,
                                                                             Dv, per_batch, k, v);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void mla_key_value_heads_backward(const Context& ctx, const float* dk, const float* dv, const float* cos,
                                  const float* sin, int64_t B, int64_t S, int64_t H, int64_t N, int64_t P, int64_t Dv,
                                  bool per_batch, float* dkv_b, float* dk_rope) {
  const char* op = "mla_key_value_heads backward";
  DeviceGuard guard(ctx.index, op);
  const int64_t n = B * S * H * (N + Dv);
  if (n > 0) {
    key_value_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(dk, dv, B, S, H, N, P, Dv, dkv_b);
    LOOM_CUDA_CHECK_LAUNCH(op);
  }
  const int64_t pairs = B * S * (P / 2);
  if (pairs > 0) {
    rope_key_grad_kernel<<<grid_for(pairs, kThreads), kThreads, 0, ctx.stream>>>(dk, cos, sin, B, S, H, N, P, per_batch,
                                                                                 dk_rope);
    LOOM_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace loom::cuda
