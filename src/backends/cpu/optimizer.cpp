#include "backends/cpu/optimizer.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/elementwise.h"

#include "core/parallel.h"

namespace loom::cpu {

namespace {
// One element of AdamW; the fast and the reference kernels share it so that they cannot drift apart.
inline void adamw_element(float& param, float g, float& m, float& v, float decay, float beta1, float beta2,
                          float step_size, float bc2_sqrt, float eps) {
  float p = param * decay;
  const float mi = beta1 * m + (1.0f - beta1) * g;
  const float vi = beta2 * v + (1.0f - beta2) * g * g;
  m = mi;
  v = vi;
  p -= step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
  param = p;
}
}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, double bias_correction1, double bias_correction2,
                  bf16* param_bf16) {
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  // 4 KiB of each stream per block: the bf16 conversion reads the block's params back from L1.
  constexpr int64_t kBlock = 1024;
  parallel_for(0, n, 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t b = s; b < e; b += kBlock) {
      const int64_t be = std::min(b + kBlock, e);
#pragma omp simd
      for (int64_t i = b; i < be; ++i) adamw_element(param[i], grad[i], m[i], v[i], decay, beta1, beta2, step_size, bc2_sqrt, eps);
      if (param_bf16 != nullptr) convert_f32_to_bf16_serial(param + b, param_bf16 + b, be - b);
    }
  });
}

void adamw_update_reference(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, double bias_correction1,
                            double bias_correction2, bf16* param_bf16) {
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  for (int64_t i = 0; i < n; ++i) {
    adamw_element(param[i], grad[i], m[i], v[i], decay, beta1, beta2, step_size, bc2_sqrt, eps);
    if (param_bf16 != nullptr) param_bf16[i] = bf16::from_float(param[i]);
  }
}

double sum_of_squares(const float* x, int64_t n) {
  return parallel_reduce_chunks<double>(0, n, 1 << 15, 0.0, [&](int64_t s, int64_t e) {
    // 16 independent accumulators: one chain of dependent double adds ran at one add per 4 cycles
    // (~1.5% of a cs336-tinystories step). Lane i % 16 and the fixed final fold keep the order, and so
    // the bits, the same for any thread count.
    constexpr int kLanes = 16;
    double lanes[kLanes] = {};
    int64_t i = s;
    for (; i + kLanes <= e; i += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    }
    for (int l = 0; i < e; ++i, ++l) lanes[l] += static_cast<double>(x[i]) * x[i];
    double acc = 0.0;
    for (double lane : lanes) acc += lane;
    return acc;
  });
}

}  // namespace loom::cpu
