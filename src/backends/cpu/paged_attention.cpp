#include "backends/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/fixed_dot.h"
#include "core/parallel.h"

namespace loom::cpu {

namespace {
// The offset of (block, kv head, slot) in a [NB, Hkv, S, D] cache.
inline int64_t slot_offset(const PagedAttentionProblem& p, int32_t block, int64_t g, int64_t slot) {
  return ((static_cast<int64_t>(block) * p.Hkv + g) * p.S + slot) * p.D;
}
}  // namespace

void paged_kv_write(const PagedAttentionProblem& p, const float* k, const float* v, float* k_cache, float* v_cache) {
  const size_t bytes = static_cast<size_t>(p.D) * sizeof(float);
  for (int64_t r = 0; r < p.R; ++r) {
    const int64_t pos = p.positions[r];
    const int32_t block = p.tables[r][pos / p.S];
    for (int64_t g = 0; g < p.Hkv; ++g) {
      const int64_t at = slot_offset(p, block, g, pos % p.S);
      std::memcpy(k_cache + at, k + (r * p.Hkv + g) * p.D, bytes);
      std::memcpy(v_cache + at, v + (r * p.Hkv + g) * p.D, bytes);
    }
  }
}

void paged_attention_forward(const PagedAttentionProblem& p, const float* q, const float* k_cache,
                             const float* v_cache, float* out) {
  const int64_t group = p.H / p.Hkv, D = p.D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One (row, head) per item; a long row's work is its position, so chunks are single items.
  parallel_for(0, p.R * p.H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / p.H, h = i % p.H, g = h / group, P = p.positions[r];
      const int32_t* table = p.tables[r];
      const float* qh = q + (r * p.H + h) * D;
      scores.resize(static_cast<size_t>(P + 1));
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= P; ++j) {
        const float s = fixed_dot::dot(qh, k_cache + slot_offset(p, table[j / p.S], g, j % p.S), D) * scale;
        scores[static_cast<size_t>(j)] = s;
        max = std::max(max, s);
      }
      double total = 0;
      for (int64_t j = 0; j <= P; ++j) {
        const float e = std::exp(scores[static_cast<size_t>(j)] - max);
        scores[static_cast<size_t>(j)] = e;
        total += e;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= P; ++j) {
        const float e = scores[static_cast<size_t>(j)];
        const float* vj = v_cache + slot_offset(p, table[j / p.S], g, j % p.S);
        for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] = std::fma(e, vj[d], acc[static_cast<size_t>(d)]);
      }
      const float inv = static_cast<float>(1.0 / total);
      float* o = out + (r * p.H + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[static_cast<size_t>(d)] * inv;
    }
  });
}

}  // namespace loom::cpu
