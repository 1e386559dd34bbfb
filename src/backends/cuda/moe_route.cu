// MoE routing, balance loss and bias-update kernels (moe_route.h). E and K are small (16 and 4 in
// dsv3-mini, 256 and 8 in DeepSeek-V3), so each token's routing is one thread's sequential loop, the
// CPU's loop line for line.
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/moe_route.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid_exact(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v))); }

// a ranks before b: larger, or a number where b is NaN (ties are left to the caller's index order).
__device__ __forceinline__ bool ranks_before(float a, float b) { return a > b || (isnan(b) && !isnan(a)); }

template <typename T>
__global__ void route_forward_kernel(const T* logits, const float* bias, int64_t N, int64_t E, int64_t K,
                                     float route_scale, int32_t* index, float* gates, float* affinity) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    float* s = affinity + n * E;
    int32_t* idx = index + n * K;
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid_exact(load_f32(logits, n * E + e));
    // K passes of "the best not yet taken", scanning upward and replacing only on a strictly better
    // score: a tie keeps the lower index. "Taken" = among this token's first k choices.
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      float best_score = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t j = 0; j < k; ++j) taken = taken || idx[j] == e;
        if (taken) continue;
        const float score = __fadd_rn(s[e], bias[e]);
        if (best < 0 || ranks_before(score, best_score)) {
          best = e;
          best_score = score;
        }
      }
      idx[k] = static_cast<int32_t>(best);
      sum = __fadd_rn(sum, s[best]);
    }
    for (int64_t k = 0; k < K; ++k) gates[n * K + k] = __fmul_rn(__fdiv_rn(s[idx[k]], sum), route_scale);
  }
}

// One thread per slot; integer adds, so the counts do not depend on the order.
__global__ void count_load_kernel(const int32_t* index, int64_t slots, int32_t* load) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < slots; i += int64_t(gridDim.x) * blockDim.x) {
    atomicAdd(load + index[i], 1);
  }
}

template <typename T>
__global__ void route_backward_kernel(T* dlogits, const float* dgates, const float* daffinity, const float* affinity,
                                      const int32_t* index, int64_t N, int64_t E, int64_t K, float route_scale) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const float* s = affinity + n * E;
    const int32_t* idx = index + n * K;
    // g_k = rs * s_k / S  =>  ds_j += rs/S * (dg_j - sum_k dg_k s_k / S), as the CPU.
    float weighted = 0.0f, scale = 0.0f;
    if (dgates != nullptr) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum = __fadd_rn(sum, s[idx[k]]);
      for (int64_t k = 0; k < K; ++k) weighted = __fadd_rn(weighted, __fmul_rn(dgates[n * K + k], s[idx[k]]));
      weighted = __fdiv_rn(weighted, sum);
      scale = __fdiv_rn(route_scale, sum);
    }
    for (int64_t e = 0; e < E; ++e) {
      float ds = daffinity != nullptr ? daffinity[n * E + e] : 0.0f;
      if (dgates != nullptr) {
        for (int64_t k = 0; k < K; ++k) {  // the chosen experts are distinct: at most one k adds
          if (idx[k] == e) ds = __fadd_rn(ds, __fmul_rn(scale, __fadd_rn(dgates[n * K + k], -weighted)));
        }
      }
      store_f32(dlogits, n * E + e, __fmul_rn(__fmul_rn(ds, s[e]), __fadd_rn(1.0f, -s[e])));
    }
  }
}

// sums[n] = sum_e affinity[n, e] in double, e ascending.
__global__ void affinity_sums_kernel(const float* affinity, int64_t N, int64_t E, double* sums) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum = __dadd_rn(sum, double(affinity[n * E + e]));
    sums[n] = sum;
  }
}

// One thread per (b, e): f[b, e] (the count of sequence b's slots on e, times scale) and its loss term
// f * (P / T), P summed over t ascending as the CPU.
__global__ void balance_terms_kernel(const float* affinity, const int32_t* index, const double* sums, int64_t B,
                                     int64_t T, int64_t E, int64_t K, float scale, float* f, double* terms) {
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < B * E; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = x / E, e = x % E;
    float count = 0.0f;
    double p = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t;
      for (int64_t k = 0; k < K; ++k) {
        if (index[n * K + k] == e) count = __fadd_rn(count, 1.0f);
      }
      p = __dadd_rn(p, __ddiv_rn(double(affinity[n * E + e]), sums[n]));
    }
    const float fb = __fmul_rn(count, scale);
    f[x] = fb;
    terms[x] = __dmul_rn(double(fb), __ddiv_rn(p, double(T)));
  }
}

// One thread: per sequence the terms summed over e ascending, then the sequences over b ascending.
__global__ void balance_total_kernel(const double* terms, int64_t B, int64_t E, float alpha, float* loss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    double seq = 0;
    for (int64_t e = 0; e < E; ++e) seq = __dadd_rn(seq, terms[b * E + e]);
    total = __dadd_rn(total, seq);
  }
  loss[0] = static_cast<float>(__ddiv_rn(__dmul_rn(double(alpha), total), double(B)));
}

__global__ void balance_backward_kernel(float* daffinity, const float* dloss, const float* affinity, const float* f,
                                        int64_t B, int64_t T, int64_t E, float alpha) {
  const double c = __ddiv_rn(__dmul_rn(double(dloss[0]), double(alpha)), __dmul_rn(double(B), double(T)));
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < B * T; n += int64_t(gridDim.x) * blockDim.x) {
    const float* s = affinity + n * E;
    const float* fb = f + (n / T) * E;
    double sum = 0, fs = 0;
    for (int64_t e = 0; e < E; ++e) {
      sum = __dadd_rn(sum, double(s[e]));
      fs = __dadd_rn(fs, __dmul_rn(double(fb[e]), double(s[e])));
    }
    const double mean = __ddiv_rn(fs, sum);
    for (int64_t e = 0; e < E; ++e) {
      daffinity[n * E + e] = static_cast<float>(__ddiv_rn(__dmul_rn(c, __dadd_rn(double(fb[e]), -mean)), sum));
    }
  }
}

// One thread: E is small, and the total must be summed before any update.
__global__ void update_bias_kernel(float* bias, const int32_t* load, int64_t E, float gamma) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += load[e];
  for (int64_t e = 0; e < E; ++e) {
    const int64_t diff = total - E * static_cast<int64_t>(load[e]);
    bias[e] = __fadd_rn(bias[e], diff > 0 ? gamma : diff < 0 ? -gamma : 0.0f);
  }
}

}  // namespace

template <typename T>
void moe_route_forward(const Context& ctx, const T* logits, const float* bias, int64_t N, int64_t E, int64_t K,
                       float route_scale, int32_t* index, float* gates, float* affinity, int32_t* load) {
  const char* op = "moe_route";
  DeviceGuard guard(ctx.index, op);
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(load, 0, static_cast<size_t>(E) * sizeof(int32_t), ctx.stream));
  if (N == 0) return;
  route_forward_kernel<T><<<grid_for(N, kThreads), kThreads, 0, ctx.stream>>>(logits, bias, N, E, K, route_scale,
                                                                             index, gates, affinity);
  LOOM_CUDA_CHECK_LAUNCH(op);
  count_load_kernel<<<grid_for(N * K, kThreads), kThreads, 0, ctx.stream>>>(index, N * K, load);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void moe_route_backward(const Context& ctx, T* dlogits, const float* dgates, const float* daffinity,
                        const float* affinity, const int32_t* index, int64_t N, int64_t E, int64_t K,
                        float route_scale) {
  const char* op = "moe_route backward";
  if (N == 0) return;
  DeviceGuard guard(ctx.index, op);
  route_backward_kernel<T><<<grid_for(N, kThreads), kThreads, 0, ctx.stream>>>(dlogits, dgates, daffinity, affinity,
                                                                              index, N, E, K, route_scale);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

template void moe_route_forward<float>(const Context&, const float*, const float*, int64_t, int64_t, int64_t, float,
                                       int32_t*, float*, float*, int32_t*);
template void moe_route_forward<bf16>(const Context&, const bf16*, const float*, int64_t, int64_t, int64_t, float,
                                      int32_t*, float*, float*, int32_t*);
template void moe_route_backward<float>(const Context&, float*, const float*, const float*, const float*,
                                        const int32_t*, int64_t, int64_t, int64_t, float);
template void moe_route_backward<bf16>(const Context&, bf16*, const float*, const float*, const float*, const int32_t*,
                                       int64_t, int64_t, int64_t, float);

void moe_balance_loss_forward(const Context& ctx, const float* affinity, const int32_t* index, int64_t B, int64_t T,
                              int64_t E, int64_t K, float alpha, float* f, float* loss, double* scratch) {
  const char* op = "moe_sequence_balance_loss";
  DeviceGuard guard(ctx.index, op);
  double* sums = scratch;           // [N]
  double* terms = scratch + B * T;  // [B, E]
  const float scale = static_cast<float>(E) / static_cast<float>(K * T);  // the CPU's: 1.0 = perfectly even
  affinity_sums_kernel<<<grid_for(B * T, kThreads), kThreads, 0, ctx.stream>>>(affinity, B * T, E, sums);
  LOOM_CUDA_CHECK_LAUNCH(op);
  balance_terms_kernel<<<grid_for(B * E, kThreads), kThreads, 0, ctx.stream>>>(affinity, index, sums, B, T, E, K,
                                                                              scale, f, terms);
  LOOM_CUDA_CHECK_LAUNCH(op);
  balance_total_kernel<<<1, 32, 0, ctx.stream>>>(terms, B, E, alpha, loss);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void moe_balance_loss_backward(const Context& ctx, float* daffinity, const float* dloss, const float* affinity,
                               const float* f, int64_t B, int64_t T, int64_t E, float alpha) {
  const char* op = "moe_sequence_balance_loss backward";
  DeviceGuard guard(ctx.index, op);
  balance_backward_kernel<<<grid_for(B * T, kThreads), kThreads, 0, ctx.stream>>>(daffinity, dloss, affinity, f, B, T,
                                                                                  E, alpha);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void moe_update_bias(const Context& ctx, float* bias, const int32_t* load, int64_t E, float gamma) {
  const char* op = "moe_update_bias_";
  if (E == 0) return;
  DeviceGuard guard(ctx.index, op);
  update_bias_kernel<<<1, 32, 0, ctx.stream>>>(bias, load, E, gamma);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

}  // namespace loom::cuda
