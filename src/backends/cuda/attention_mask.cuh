// The attention mask on the device, shared by the warp kernels (attention.cu) and the GEMM blocks' row
// kernels (attention_chunked.cu): which keys a query row sees (the causal rule) and the dropout factor
// Z_ij, both as attention_problem.h defines them, so the masks are the CPU's bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/attention_problem.h"
#include "backends/cuda/device_math.cuh"

namespace loom::cuda {

// Keys [0, limit) are visible to query row i (attention_problem.h: query i sees keys j <= i + (tk - tq)).
__host__ __device__ __forceinline__ int64_t key_limit(bool causal, int64_t tq, int64_t tk, int64_t i) {
  if (!causal) return tk;
  const int64_t last = i + (tk - tq);  // the last visible key
  return last < 0 ? 0 : (last + 1 < tk ? last + 1 : tk);
}

// The dropout mask of one AttentionProblem, by value (a member of the kernels' arguments).
struct AttentionDropout {
  uint32_t threshold = 0;    // keep iff (bits >> 8) >= threshold; 0 = no dropout
  float keep_scale = 1.0f;   // 1 / (1 - p)
  uint32_t key0 = 0, key1 = 0;
  int64_t tq = 0, tk64 = 0;  // attention_dropout_counter's row-major [N, Tq, Tk64] geometry

  static AttentionDropout of(const AttentionProblem& p) {
    AttentionDropout d;
    // p = 0: threshold 0 keeps everything and the factor is exactly 1 (factor's early return).
    d.threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p.dropout_p) * 16777216.0));
    d.keep_scale = 1.0f / (1.0f - p.dropout_p);
    d.key0 = p.dropout_key.k0;
    d.key1 = p.dropout_key.k1;
    d.tq = p.tq;
    d.tk64 = (p.tk + 63) / 64 * 64;
    return d;
  }

  // Z of head n, query row i, key j: keep_scale or 0; 1 without dropout.
  __device__ __forceinline__ float factor(int64_t n, int64_t i, int64_t j) const {
    if (threshold == 0) return 1.0f;
    const uint64_t counter = static_cast<uint64_t>(n * tq + i) * static_cast<uint64_t>(tk64) + static_cast<uint64_t>(j);
    return keep_element(key0, key1, counter, threshold) ? keep_scale : 0.0f;
  }
};

}  // namespace loom::cuda
