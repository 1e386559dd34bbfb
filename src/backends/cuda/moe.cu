// Routed-expert kernels (moe.h). Scratch buffers come from the device's caching allocator and go back
// to it after the launches (the stream orders any reuse).
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/gemm.h"
#include "backends/cuda/moe.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
constexpr DType dtype_of_operand() {
  return sizeof(T) == 2 ? DType::BF16 : DType::F32;
}

// dst[p, :] = src[slot_of_row[p] / K, :] (converted to Out).
template <typename Out, typename In>
__global__ void gather_rows_kernel(Out* dst, const In* src, const int32_t* slot_of_row, int64_t K, int64_t P, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < P * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / C, c = i % C;
    store_f32(dst, i, load_f32(src, int64_t(slot_of_row[p] / K) * C + c));
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// a = silu(h1) * h3, rounded to T (the w2 GEMM's operand).
template <typename T>
__global__ void swiglu_kernel(T* a, const float* h1, const float* h3, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    store_f32(a, i, h1[i] * sigmoid(h1[i]) * h3[i]);
  }
}

// y[n, :] = sum over k in order of gates[n, k] * rows[row_of_slot[n*K + k], :]; gates null: weight 1.
__global__ void combine_kernel(float* y, const float* rows, const float* gates, const int32_t* row_of_slot, int64_t N,
                               int64_t K, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const float g = gates != nullptr ? gates[n * K + k] : 1.0f;
      const float v = rows[int64_t(row_of_slot[n * K + k]) * C + c];
      s = k == 0 ? g * v : s + g * v;
    }
    y[i] = s;
  }
}

// One block per row p (slot s, gate g), from dau = dy w2[e] (f32):
//   dgates[s] = <dau, a>;  dh1 = g dau h3 silu'(h1);  dh3 = g dau silu(h1);  ga = g a (null: not wanted).
template <typename T>
__global__ void backward_rows_kernel(T* dh1, T* dh3, T* ga, float* dgates, const float* dau, const float* h1,
                                     const float* h3, const float* gates, const int32_t* slot_of_row, int64_t F) {
  __shared__ float scratch[32];
  const int64_t p = blockIdx.x;
  const int32_t slot = slot_of_row[p];
  const float g = gates[slot];
  float dot = 0.0f;
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    const int64_t i = p * F + f;
    const float s = sigmoid(h1[i]);
    const float silu = h1[i] * s;
    const float a = silu * h3[i];
    dot += dau[i] * a;
    const float da = g * dau[i];
    store_f32(dh1, i, da * h3[i] * s * (1.0f + h1[i] * (1.0f - s)));
    store_f32(dh3, i, da * silu);
    if (ga != nullptr) store_f32(ga, i, g * a);
  }
  dot = block_sum(dot, scratch);
  if (dgates != nullptr && threadIdx.x == 0) dgates[slot] = dot;
}

// A scratch buffer from the device's caching allocator, returned when it goes out of scope.
class Scratch {
 public:
  Scratch(int device, size_t bytes) : allocator_(device_allocator(device)), bytes_(bytes) {
    ptr_ = bytes_ ? allocator_.allocate(bytes_) : nullptr;
  }
  ~Scratch() {
    if (ptr_ != nullptr) allocator_.deallocate(ptr_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Allocator& allocator_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// C[M,N] (f32) = alpha op(A) op(B) + beta C with T operands, row-major (cuda::gemm's contract).
template <typename T>
void gemm_t(const Context& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
            int64_t ldb, float beta, float* C, int64_t ldc) {
  GemmProblem p;
  p.trans_a = ta;
  p.trans_b = tb;
  p.M = M, p.N = N, p.K = K, p.beta = beta;
  p.A = A, p.lda = lda, p.B = B, p.ldb = ldb, p.C = C, p.ldc = ldc;
  p.input = dtype_of_operand<T>();
  p.output = DType::F32;
  gemm(ctx, p);
}

int64_t rows_of(const MoeDispatch& d, int64_t e) { return d.offsets[size_t(e + 1)] - d.offsets[size_t(e)]; }

}  // namespace

template <typename T>
void moe_experts_forward(const Context& ctx, const MoeDeviceDispatch& d, const T* x, const float* gates, const T* w1,
                         const T* w3, const T* w2, int64_t C, int64_t F, float* y, float* h1, float* h3) {
  const char* op = "moe_experts";
  const MoeDispatch& hd = *d.host;
  const int64_t N = hd.N, K = hd.K, E = hd.E, P = N * K;
  if (N == 0) return;
  DeviceGuard guard(ctx.index, op);
  Scratch xs(ctx.index, size_t(P * C) * sizeof(T)), at(ctx.index, size_t(P * F) * sizeof(T));
  Scratch yp(ctx.index, size_t(P * C) * sizeof(float));
  Scratch h1s(ctx.index, h1 != nullptr ? 0 : size_t(P * F) * sizeof(float));
  Scratch h3s(ctx.index, h3 != nullptr ? 0 : size_t(P * F) * sizeof(float));
  float* ph1 = h1 != nullptr ? h1 : h1s.as<float>();
  float* ph3 = h3 != nullptr ? h3 : h3s.as<float>();
  gather_rows_kernel<<<grid_for(P * C, kThreads), kThreads, 0, ctx.stream>>>(xs.as<T>(), x, d.slot_of_row, K, P, C);
  LOOM_CUDA_CHECK_LAUNCH(op);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = hd.offsets[size_t(e)], rows = rows_of(hd, e);
    if (rows == 0) continue;
    gemm_t(ctx, false, true, rows, F, C, xs.as<T>() + o * C, C, w1 + e * F * C, C, 0.0f, ph1 + o * F, F);
    gemm_t(ctx, false, true, rows, F, C, xs.as<T>() + o * C, C, w3 + e * F * C, C, 0.0f, ph3 + o * F, F);
  }
  swiglu_kernel<<<grid_for(P * F, kThreads), kThreads, 0, ctx.stream>>>(at.as<T>(), ph1, ph3, P * F);
  LOOM_CUDA_CHECK_LAUNCH(op);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = hd.offsets[size_t(e)], rows = rows_of(hd, e);
    if (rows == 0) continue;
    gemm_t(ctx, false, true, rows, C, F, at.as<T>() + o * F, F, w2 + e * C * F, F, 0.0f, yp.as<float>() + o * C, C);
  }
  combine_kernel<<<grid_for(N * C, kThreads), kThreads, 0, ctx.stream>>>(y, yp.as<float>(), gates, d.row_of_slot, N, K,
                                                                         C);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void moe_experts_backward(const Context& ctx, const MoeDeviceDispatch& d, const float* dy, const T* x,
                          const float* gates, const T* w1, const T* w3, const T* w2, const float* h1, const float* h3,
                          int64_t C, int64_t F, float* dx, float* dgates, float* dw1, float* dw3, float* dw2) {
  const char* op = "moe_experts backward";
  const MoeDispatch& hd = *d.host;
  const int64_t N = hd.N, K = hd.K, E = hd.E, P = N * K;
  DeviceGuard guard(ctx.index, op);
  for (float* w : {dw1, dw3, dw2}) {  // experts no token chose keep these zeros
    if (w != nullptr) LOOM_CUDA_CHECK(op, cudaMemsetAsync(w, 0, size_t(E * F * C) * sizeof(float), ctx.stream));
  }
  if (N == 0) {
    if (dx != nullptr) LOOM_CUDA_CHECK(op, cudaMemsetAsync(dx, 0, size_t(N * C) * sizeof(float), ctx.stream));
    return;
  }
  const bool want_w13 = dw1 != nullptr || dw3 != nullptr;
  Scratch dyp(ctx.index, size_t(P * C) * sizeof(T)), dau(ctx.index, size_t(P * F) * sizeof(float));
  Scratch dh1(ctx.index, size_t(P * F) * sizeof(T)), dh3(ctx.index, size_t(P * F) * sizeof(T));
  Scratch ga(ctx.index, dw2 != nullptr ? size_t(P * F) * sizeof(T) : 0);
  Scratch xs(ctx.index, want_w13 ? size_t(P * C) * sizeof(T) : 0);
  Scratch dxp(ctx.index, dx != nullptr ? size_t(P * C) * sizeof(float) : 0);
  gather_rows_kernel<<<grid_for(P * C, kThreads), kThreads, 0, ctx.stream>>>(dyp.as<T>(), dy, d.slot_of_row, K, P, C);
  LOOM_CUDA_CHECK_LAUNCH(op);
  if (want_w13) {
    gather_rows_kernel<<<grid_for(P * C, kThreads), kThreads, 0, ctx.stream>>>(xs.as<T>(), x, d.slot_of_row, K, P, C);
    LOOM_CUDA_CHECK_LAUNCH(op);
  }
  for (int64_t e = 0; e < E; ++e) {  // dau = dy w2[e]
    const int64_t o = hd.offsets[size_t(e)], rows = rows_of(hd, e);
    if (rows == 0) continue;
    gemm_t(ctx, false, false, rows, F, C, dyp.as<T>() + o * C, C, w2 + e * C * F, F, 0.0f, dau.as<float>() + o * F, F);
  }
  LOOM_CHECK(P <= 0x7fffffff, op, ": ", P, " rows exceed one launch's grid");
  backward_rows_kernel<<<unsigned(P), kThreads, 0, ctx.stream>>>(dh1.as<T>(), dh3.as<T>(), ga.as<T>(), dgates,
                                                                  dau.as<float>(), h1, h3, gates, d.slot_of_row, F);
  LOOM_CUDA_CHECK_LAUNCH(op);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = hd.offsets[size_t(e)], rows = rows_of(hd, e);
    if (rows == 0) continue;
    if (dx != nullptr) {  // dxp = dh1 w1[e] + dh3 w3[e]
      gemm_t(ctx, false, false, rows, C, F, dh1.as<T>() + o * F, F, w1 + e * F * C, C, 0.0f, dxp.as<float>() + o * C, C);
      gemm_t(ctx, false, false, rows, C, F, dh3.as<T>() + o * F, F, w3 + e * F * C, C, 1.0f, dxp.as<float>() + o * C, C);
    }
    if (dw1 != nullptr) {  // dw1[e] = dh1^T x
      gemm_t(ctx, true, false, F, C, rows, dh1.as<T>() + o * F, F, xs.as<T>() + o * C, C, 0.0f, dw1 + e * F * C, C);
    }
    if (dw3 != nullptr) {
      gemm_t(ctx, true, false, F, C, rows, dh3.as<T>() + o * F, F, xs.as<T>() + o * C, C, 0.0f, dw3 + e * F * C, C);
    }
    if (dw2 != nullptr) {  // dw2[e] = dy^T (g a)
      gemm_t(ctx, true, false, C, F, rows, dyp.as<T>() + o * C, C, ga.as<T>() + o * F, F, 0.0f, dw2 + e * C * F, F);
    }
  }
  if (dx != nullptr) {
    combine_kernel<<<grid_for(N * C, kThreads), kThreads, 0, ctx.stream>>>(dx, dxp.as<float>(), nullptr,
                                                                           d.row_of_slot, N, K, C);
    LOOM_CUDA_CHECK_LAUNCH(op);
  }
}

template void moe_experts_forward<float>(const Context&, const MoeDeviceDispatch&, const float*, const float*,
                                         const float*, const float*, const float*, int64_t, int64_t, float*, float*,
                                         float*);
template void moe_experts_forward<bf16>(const Context&, const MoeDeviceDispatch&, const bf16*, const float*,
                                        const bf16*, const bf16*, const bf16*, int64_t, int64_t, float*, float*, float*);
template void moe_experts_backward<float>(const Context&, const MoeDeviceDispatch&, const float*, const float*,
                                          const float*, const float*, const float*, const float*, const float*,
                                          const float*, int64_t, int64_t, float*, float*, float*, float*, float*);
template void moe_experts_backward<bf16>(const Context&, const MoeDeviceDispatch&, const float*, const bf16*,
                                         const float*, const bf16*, const bf16*, const bf16*, const float*, const float*,
                                         int64_t, int64_t, float*, float*, float*, float*, float*);

}  // namespace loom::cuda
