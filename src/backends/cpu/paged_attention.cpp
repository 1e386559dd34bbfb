#include "backends/cpu/paged_attention.h"

// GCC 12 flags its own AVX-512 intrinsic headers (_mm512_undefined_*, inlined from fast_exp.h's exp16)
// with false positives under -Wall, as in loss.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/fast_exp.h"
#include "backends/cpu/fixed_dot.h"
#include "core/parallel.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

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
  const int64_t group = p.H / p.Hkv, D = p.D, Dv = p.value_dim(), g = h / group, P = p.positions[r], S = p.S;
  const float scale = p.scale > 0 ? p.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const int32_t* table = p.tables[r];
  const float* qh = q + (r * p.H + h) * D;
  // The sequence's positions block by block: block i holds positions [i S, i S + n), its slots D apart.
  auto for_each_block = [&](auto&& f) {
    for (int64_t i = 0, j = 0; j <= P; ++i, j += S) f(j, std::min(S, P + 1 - j), paged_slot_offset(p, table[i], g, 0));
  };
  // The scores, four keys at a time (fixed_dot::dot4: each key's dot in dot's own order).
  for_each_block([&](int64_t j, int64_t n, int64_t at) {
    const float* k = k_cache + at;
    int64_t s = 0;
    for (; s + 4 <= n; s += 4) fixed_dot::dot4(qh, k + s * D, D, D, scores + j + s);
    for (; s < n; ++s) scores[j + s] = fixed_dot::dot(qh, k + s * D, D);
  });
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= P; ++j) {
    scores[j] *= scale;
    max = std::max(max, scores[j]);
  }
  // e_j = exp(s_j - max), every position through the same exp (16 at a time, the last vector masked),
  // then summed in order. (std::exp, a library call per position, was ~40% of this function's time.)
#if defined(__AVX512F__)
  const __m512 max16 = _mm512_set1_ps(max);
  for (int64_t j = 0; j <= P; j += 16) {
    const __mmask16 k = tail_mask(P + 1 - j);
    _mm512_mask_storeu_ps(scores + j, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, scores + j), max16)));
  }
#else
  for (int64_t j = 0; j <= P; ++j) scores[j] = fast_exp(scores[j] - max);
#endif
  double total = 0;
  for (int64_t j = 0; j <= P; ++j) total += scores[j];
  // acc[d] = fma(e_j, v_j[d], acc[d]) over j in order, 64 values of d at a time held in registers
  // (through `acc` in memory, each position's fused multiply-adds waited on the stores of the one
  // before), the rest of Dv one value at a time: the same operations either way.
  int64_t d0 = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  for (; d0 + 64 <= Dv; d0 += 64) {
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for_each_block([&](int64_t j, int64_t n, int64_t at) {
      const float* v = v_cache + at + d0;
      for (int64_t s = 0; s < n; ++s, v += D) {
        const __m512 e = _mm512_set1_ps(scores[j + s]);
        a0 = _mm512_fmadd_ps(e, _mm512_loadu_ps(v), a0);
        a1 = _mm512_fmadd_ps(e, _mm512_loadu_ps(v + 16), a1);
        a2 = _mm512_fmadd_ps(e, _mm512_loadu_ps(v + 32), a2);
        a3 = _mm512_fmadd_ps(e, _mm512_loadu_ps(v + 48), a3);
      }
    });
    _mm512_storeu_ps(acc + d0, a0);
    _mm512_storeu_ps(acc + d0 + 16, a1);
    _mm512_storeu_ps(acc + d0 + 32, a2);
    _mm512_storeu_ps(acc + d0 + 48, a3);
#else
    __m256 a[8];
    for (__m256& x : a) x = _mm256_setzero_ps();
    for_each_block([&](int64_t j, int64_t n, int64_t at) {
      const float* v = v_cache + at + d0;
      for (int64_t s = 0; s < n; ++s, v += D) {
        const __m256 e = _mm256_set1_ps(scores[j + s]);
        for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(e, _mm256_loadu_ps(v + 8 * i), a[i]);
      }
    });
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
#endif
  }
#endif
  if (d0 < Dv) {
    std::fill(acc + d0, acc + Dv, 0.0f);
    for_each_block([&](int64_t j, int64_t n, int64_t at) {
      const float* v = v_cache + at;
      for (int64_t s = 0; s < n; ++s, v += D) {
        for (int64_t d = d0; d < Dv; ++d) acc[d] = std::fma(scores[j + s], v[d], acc[d]);
      }
    });
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
