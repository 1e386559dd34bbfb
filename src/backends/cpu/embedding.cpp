// Token embedding kernels. Legend: N tokens, V vocab rows, C channels.
#include "backends/cpu/embedding.h"

#include <cstring>

#include "core/parallel.h"

namespace loom::cpu {

int64_t embedding_first_bad_id(const int32_t* ids, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) return n;
  }
  return -1;
}

void embedding_forward(void* out, const int32_t* ids, const void* table, int64_t N, int64_t C,
                       int64_t elem_bytes) {
  const size_t row_bytes = static_cast<size_t>(C * elem_bytes);
  auto* dst = static_cast<char*>(out);
  const auto* src = static_cast<const char*>(table);
  parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      std::memcpy(dst + n * static_cast<int64_t>(row_bytes), src + ids[n] * static_cast<int64_t>(row_bytes),
                  row_bytes);
    }
  });
}

void embedding_backward(float* d_table, const int32_t* ids, const float* d_out, int64_t N, int64_t V,
                        int64_t C) {
  // Zeroing is row-parallel (any split is fine: it is not a reduction).
  parallel_for(0, V, 256, [&](int64_t v0, int64_t v1) {
    std::memset(d_table + v0 * C, 0, static_cast<size_t>((v1 - v0) * C) * sizeof(float));
  });
  // 64 columns = one 256-byte slice per row: whole cache lines, and enough chunks for 2+ threads even
  // at C = 128. Inside a chunk the tokens go in order, so the sum for each element is fixed.
  parallel_for(0, C, 64, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t n = 0; n < N; ++n) {
      float* dst = d_table + static_cast<int64_t>(ids[n]) * C + c0;
      const float* src = d_out + n * C + c0;
      for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace loom::cpu
