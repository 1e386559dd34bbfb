#include "backends/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/fixed_dot.h"
#include "core/parallel.h"

namespace loom::cpu {

void paged_kv_write(const PagedAttentionProblem& p, const float* k, const float* v, float* k_cache, float* v_cache) {
  const size_t bytes = static_cast<size_t>(p.D) * sizeof(float);
  for (int64_t r = 0; r < p.R; ++r) {
    const int64_t pos = p.positions[r];
    const int32_t block = p.tables[r][pos / p.S];
    for (int64_t g = 0; g < p.Hkv; ++g) {
      const int64_t at = paged_slot_offset(p, block, g, pos % p.S);
      std::memcpy(k_cache + at, k + (r * p.Hkv + g) * p.D, bytes);
      std::memcpy(v_cache + at, v + (r * p.Hkv + g) * p.D, bytes);
    }
  }
}

void paged_row_write(const PagedAttentionProblem& p, const float* x, float* cache) {
  const size_t bytes = static_cast<size_t>(p.D) * sizeof(float);
  for (int64_t r = 0; r < p.R; ++r) {
    for (int64_t g = 0; g < p.Hkv; ++g) std::memcpy(cache + paged_row_offset(p, r, g), x + (r * p.Hkv + g) * p.D, bytes);
  }
}

void paged_attention_head(const PagedAttentionProblem& p, int64_t r, int64_t h, const float* q, const float* k_cache,
                          const float* v_cache, float* out, float* scores, float* acc) {
  const int64_t group = p.H / p.Hkv, D = p.D, Dv = p.value_dim(), g = h / group, P = p.positions[r];
  const float scale = p.scale > 0 ? p.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const int32_t* table = p.tables[r];
  const float* qh = q + (r * p.H + h) * D;
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= P; ++j) {
    const float s = fixed_dot::dot(qh, k_cache + paged_slot_offset(p, table[j / p.S], g, j % p.S), D) * scale;
    scores[j] = s;
    max = std::max(max, s);
  }
  double total = 0;
  for (int64_t j = 0; j <= P; ++j) {
    const float e = std::exp(scores[j] - max);
    scores[j] = e;
    total += e;
  }
  std::fill(acc, acc + Dv, 0.0f);
  for (int64_t j = 0; j <= P; ++j) {
    const float e = scores[j];
    const float* vj = v_cache + paged_slot_offset(p, table[j / p.S], g, j % p.S);
    for (int64_t d = 0; d < Dv; ++d) acc[d] = std::fma(e, vj[d], acc[d]);
  }
  const float inv = static_cast<float>(1.0 / total);
  float* o = out + (r * p.H + h) * Dv;
  for (int64_t d = 0; d < Dv; ++d) o[d] = acc[d] * inv;
}

void paged_attention_forward(const PagedAttentionProblem& p, const float* q, const float* k_cache,
                             const float* v_cache, float* out) {
  // One (row, head) per item; a long row's work is its position, so chunks are single items.
  parallel_for(0, p.R * p.H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(p.value_dim()));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / p.H;
      scores.resize(static_cast<size_t>(p.positions[r] + 1));
      paged_attention_head(p, r, i % p.H, q, k_cache, v_cache, out, scores.data(), acc.data());
    }
  });
}

}  // namespace loom::cpu
