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

namespace {

// Asks for `floats` floats from x into L1, a cache line at a time.
void prefetch_floats(const float* x, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(x + i, 0, 3);
}

// Heads h0 .. h0 + NQ - 1 of row r, all reading k/v head g: each head's numbers are computed by exactly
// the operations paged_attention.h states, the NQ heads' side by side so that their independent chains
// (the dots' partial sums, the softmax's sum, the value sums) fill the cores' pipelines where one head's
// chain alone waits on each fused multiply-add's latency, and each key and value is loaded once for all
// NQ. scores: NQ x (P + 1) floats; acc: NQ x Dv floats.
template <int NQ>
void attend(const PagedAttentionProblem& p, int64_t r, int64_t h0, const float* q, const float* k_cache,
            const float* v_cache, float* out, float* scores, float* acc) {
  const int64_t group = p.H / p.Hkv, D = p.D, Dv = p.value_dim(), g = h0 / group, P = p.positions[r], S = p.S;
  const float scale = p.scale > 0 ? p.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const int32_t* table = p.tables[r];
  const int64_t n_pos = P + 1;
  const float* qh[NQ];
  float* sc[NQ];
  for (int i = 0; i < NQ; ++i) {
    qh[i] = q + (r * p.H + h0 + i) * D;
    sc[i] = scores + i * n_pos;
  }
  // The sequence's positions block by block: block i holds positions [i S, i S + n), its slots D apart.
  auto for_each_block = [&](auto&& f) {
    for (int64_t i = 0, j = 0; j <= P; ++i, j += S) f(j, std::min(S, P + 1 - j), paged_slot_offset(p, table[i], g, 0));
  };
  // The scores, four keys at a time for every head (each key's dot in fixed_dot::dot's order).
  // A block's slots (S x D floats, a page at the usual 16 x 64) lie apart from the next block's, where
  // the hardware prefetcher does not follow, and in a batched step they come from DRAM: each block asks
  // for the next block's keys and its own values before its dots.
  const int64_t k8 = D - D % 8;
  paged_attention_prefetch(p, r, h0, k_cache);
  for_each_block([&](int64_t j, int64_t n, int64_t at) {
    const float* k = k_cache + at;
    if (j + S <= P) prefetch_floats(k_cache + paged_slot_offset(p, table[(j + S) / S], g, 0), std::min(S, P + 1 - j - S) * D);
    prefetch_floats(v_cache + at, n * D);
    int64_t s = 0;
    for (; s + 4 <= n; s += 4) {
      const float* ks = k + s * D;
      fixed_dot::Acc c[NQ][4];
      for (int i = 0; i < NQ; ++i) {
        for (int u = 0; u < 4; ++u) c[i][u] = fixed_dot::zero();
      }
      for (int64_t d = 0; d < k8; d += 8) {
        const fixed_dot::Acc k0 = fixed_dot::load(ks + d), k1 = fixed_dot::load(ks + D + d),
                             k2 = fixed_dot::load(ks + 2 * D + d), k3 = fixed_dot::load(ks + 3 * D + d);
        for (int i = 0; i < NQ; ++i) {
          const fixed_dot::Acc x = fixed_dot::load(qh[i] + d);
          c[i][0] = fixed_dot::fma(x, k0, c[i][0]);
          c[i][1] = fixed_dot::fma(x, k1, c[i][1]);
          c[i][2] = fixed_dot::fma(x, k2, c[i][2]);
          c[i][3] = fixed_dot::fma(x, k3, c[i][3]);
        }
      }
      for (int i = 0; i < NQ; ++i) {
        for (int u = 0; u < 4; ++u) sc[i][j + s + u] = fixed_dot::tail(fixed_dot::finish(c[i][u]), qh[i], ks + u * D, k8, D);
      }
    }
    for (; s < n; ++s) {
      for (int i = 0; i < NQ; ++i) sc[i][j + s] = fixed_dot::dot(qh[i], k + s * D, D);
    }
  });
  // Scaled, then e_j = exp(s_j - max): every position through the same exp (16 at a time, the last
  // vector masked). The maximum is exact in any order, so it is taken 16 lanes at a time.
  for (int i = 0; i < NQ; ++i) {
    float* s = sc[i];
#if defined(__AVX512F__)
    const __m512 scale16 = _mm512_set1_ps(scale);
    __m512 max16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n_pos; j += 16) {
      const __mmask16 m = tail_mask(n_pos - j);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), scale16);
      _mm512_mask_storeu_ps(s + j, m, x);
      max16 = _mm512_mask_max_ps(max16, m, x, max16);
    }
    max16 = _mm512_set1_ps(_mm512_reduce_max_ps(max16));
    for (int64_t j = 0; j < n_pos; j += 16) {
      const __mmask16 m = tail_mask(n_pos - j);
      _mm512_mask_storeu_ps(s + j, m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), max16)));
    }
#else
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_pos; ++j) {
      s[j] *= scale;
      max = std::max(max, s[j]);
    }
    for (int64_t j = 0; j < n_pos; ++j) s[j] = fast_exp(s[j] - max);
#endif
  }
  // Each head's sum in j order, in double, the heads' sums side by side.
  double total[NQ] = {};
  for (int64_t j = 0; j < n_pos; ++j) {
    for (int i = 0; i < NQ; ++i) total[i] += sc[i][j];
  }
  // acc[d] = fma(e_j, v_j[d], acc[d]) over j in order, 64 values of d at a time held in registers for
  // every head (each value loaded once for all of them), the rest of Dv one value at a time: the same
  // operations either way.
  int64_t d0 = 0;
#if defined(__AVX512F__)
  for (; d0 + 64 <= Dv; d0 += 64) {
    __m512 a[NQ][4];
    for (int i = 0; i < NQ; ++i) {
      for (int u = 0; u < 4; ++u) a[i][u] = _mm512_setzero_ps();
    }
    for_each_block([&](int64_t j, int64_t n, int64_t at) {
      const float* v = v_cache + at + d0;
      for (int64_t s = 0; s < n; ++s, v += D) {
        const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), v2 = _mm512_loadu_ps(v + 32),
                     v3 = _mm512_loadu_ps(v + 48);
        for (int i = 0; i < NQ; ++i) {
          const __m512 e = _mm512_set1_ps(sc[i][j + s]);
          a[i][0] = _mm512_fmadd_ps(e, v0, a[i][0]);
          a[i][1] = _mm512_fmadd_ps(e, v1, a[i][1]);
          a[i][2] = _mm512_fmadd_ps(e, v2, a[i][2]);
          a[i][3] = _mm512_fmadd_ps(e, v3, a[i][3]);
        }
      }
    });
    for (int i = 0; i < NQ; ++i) {
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + i * Dv + d0 + 16 * u, a[i][u]);
    }
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (; d0 + 64 <= Dv; d0 += 64) {
    for (int i = 0; i < NQ; ++i) {
      __m256 a[8];
      for (__m256& x : a) x = _mm256_setzero_ps();
      for_each_block([&](int64_t j, int64_t n, int64_t at) {
        const float* v = v_cache + at + d0;
        for (int64_t s = 0; s < n; ++s, v += D) {
          const __m256 e = _mm256_set1_ps(sc[i][j + s]);
          for (int w = 0; w < 8; ++w) a[w] = _mm256_fmadd_ps(e, _mm256_loadu_ps(v + 8 * w), a[w]);
        }
      });
      for (int w = 0; w < 8; ++w) _mm256_storeu_ps(acc + i * Dv + d0 + 8 * w, a[w]);
    }
  }
#endif
  if (d0 < Dv) {
    for (int i = 0; i < NQ; ++i) std::fill(acc + i * Dv + d0, acc + (i + 1) * Dv, 0.0f);
    for_each_block([&](int64_t j, int64_t n, int64_t at) {
      const float* v = v_cache + at;
      for (int64_t s = 0; s < n; ++s, v += D) {
        for (int i = 0; i < NQ; ++i) {
          float* a = acc + i * Dv;
          for (int64_t d = d0; d < Dv; ++d) a[d] = std::fma(sc[i][j + s], v[d], a[d]);
        }
      }
    });
  }
  for (int i = 0; i < NQ; ++i) {
    const float inv = static_cast<float>(1.0 / total[i]);
    const float* a = acc + i * Dv;
    float* o = out + (r * p.H + h0 + i) * Dv;
    for (int64_t d = 0; d < Dv; ++d) o[d] = a[d] * inv;
  }
}

}  // namespace

void paged_attention_prefetch(const PagedAttentionProblem& p, int64_t r, int64_t h, const float* k_cache) {
  const int64_t g = h / (p.H / p.Hkv);
  prefetch_floats(k_cache + paged_slot_offset(p, p.tables[r][0], g, 0), std::min(p.S, p.positions[r] + 1) * p.D);
}

void paged_attention_heads(const PagedAttentionProblem& p, int64_t r, int64_t h0, int64_t h1, const float* q,
                           const float* k_cache, const float* v_cache, float* out, float* scores, float* acc) {
  const int64_t group = p.H / p.Hkv;
  for (int64_t h = h0; h < h1;) {
    // Up to kHeadsTogether heads of one k/v head at a time.
    const int64_t n = std::min({kHeadsTogether, h1 - h, group - h % group});
    switch (n) {
      case 1: attend<1>(p, r, h, q, k_cache, v_cache, out, scores, acc); break;
      case 2: attend<2>(p, r, h, q, k_cache, v_cache, out, scores, acc); break;
      case 3: attend<3>(p, r, h, q, k_cache, v_cache, out, scores, acc); break;
      default: attend<4>(p, r, h, q, k_cache, v_cache, out, scores, acc); break;
    }
    h += n;
  }
}

void paged_attention_forward(const PagedAttentionProblem& p, const float* q, const float* k_cache,
                             const float* v_cache, float* out) {
  // One (row, k/v head) per item, its query heads together; a long row's work is its position, so
  // chunks are single items.
  const int64_t group = p.H / p.Hkv;
  parallel_for(0, p.R * p.Hkv, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(kHeadsTogether * p.value_dim()));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / p.Hkv, g = i % p.Hkv;
      scores.resize(static_cast<size_t>(kHeadsTogether * (p.positions[r] + 1)));
      paged_attention_heads(p, r, g * group, (g + 1) * group, q, k_cache, v_cache, out, scores.data(), acc.data());
    }
  });
}

}  // namespace loom::cpu
