// CPU kernels for softmax, plus the 16-lane float vector helpers (load/store/exp2) that softmax and
// attention share.
//
// Layout: softmax runs over the middle axis of a contiguous [outer, n, inner] view of the tensor
// (inner == 1 is the common "last dimension" case).
//
// The vector type is a GCC/Clang vector extension of 16 floats: with -march=native on an AVX-512
// machine every operation is one zmm instruction; elsewhere the compiler splits it into AVX2/SSE
// halves, so the kernels stay portable without #ifdefs.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::cpu {

namespace simd {

using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);  // compiles to one unaligned vector load
  return v;
}
inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }
inline f32x16 splat(float x) { return f32x16{} + x; }
inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
inline float reduce_max(f32x16 v) {
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline float reduce_sum(f32x16 v) {
  // Pairwise, in a fixed order: deterministic and slightly more accurate than a running sum.
  float s[16];
  std::memcpy(s, &v, sizeof s);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) s[i] += s[i + w];
  return s[0];
}

// 2^x, relative error ~2e-7 over the whole float range. x <= -126 (including -inf) gives exactly 0,
// which the attention kernels rely on for masked scores; NaN propagates.
// Method: x = n + f with n = round(x), |f| <= 1/2; 2^f = e^(f ln2) by its degree-7 Taylor polynomial
// (truncation error (ln2/2)^8/8! ~ 5e-9), and 2^n is built in the exponent bits.
inline f32x16 exp2(f32x16 x) {
  const f32x16 lo = splat(-126.0f), hi = splat(127.0f);
  const auto underflow = x < lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const f32x16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const f32x16 n = (x + magic) - magic;
  const f32x16 f = (x - n) * 0.6931471805599453f;
  f32x16 p = splat(1.0f / 5040.0f);
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const f32x16 r = p * scale;
  return underflow ? f32x16{} : r;
}

inline f32x16 exp(f32x16 x) { return exp2(x * 1.4426950408889634f); }

}  // namespace simd

// y = softmax(x) over n for each (outer, inner). A row that is entirely -inf gives zeros (not NaN).
void softmax_forward(float* y, const float* x, int64_t outer, int64_t n, int64_t inner);
// dx = y * (dy - sum_n(dy * y)).
void softmax_backward(float* dx, const float* y, const float* dy, int64_t outer, int64_t n, int64_t inner);

}  // namespace loom::cpu
