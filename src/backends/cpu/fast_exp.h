// A fast f32 exp, scalar and 16 lanes wide (AVX-512), for the kernels whose
// exponentials are a measurable share of their time: the fused softmax + cross-entropy (loss.cpp) and
// paged attention's softmax (paged_attention.cpp; one std::exp call per position and head there was
// ~40% of a batched decode step's attention).
//
// exp is a Cephes-style polynomial (Moshier, "Methods and Programs for Mathematical Functions"), relative
// error ~2e-7, every operation written out. A kernel built with AVX-512 runs all its elements through
// exp16 (its tail masked), so which elements share a vector changes no result.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loom::cpu {

// exp(x) for x in about [-87, 88]; inputs here are x - max <= 0, clamped below so 2^n stays normal
// (exp(-87) ~ 1.6e-38, indistinguishable from 0 next to the row's largest term, which is 1).
inline float fast_exp(float x) {
  x = std::max(x, -87.0f);
  x = std::min(x, 88.0f);
  // n = round(x / ln 2) with the 1.5 * 2^23 trick: adding it rounds to an integer in the low mantissa bits.
  const float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  // r = x - n ln2, with ln2 split in two (Cody-Waite) so r is exact enough.
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  // 2^n from the rounded integer's bits (t's mantissa holds n + 0x400000).
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  return y * scale;
}

#if defined(__AVX512F__)
// The same exp as fast_exp, 16 lanes: 2^n via scalef instead of building the exponent bits.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// The lanes [0, min(left, 16)) of a vector: all of them, or a row's last, partial vector.
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}
#endif

}  // namespace loom::cpu
