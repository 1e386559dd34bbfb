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

#include "backends/cpu/kernel_isa.h"

namespace loom::cpu {

namespace simd {
inline namespace LOOM_KERNEL_NS {  // one copy per instruction set: kernel_isa.h

using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);  // compiles to one unaligned vector load
  return v;
}
inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }
// A broadcast. (Not `f32x16{} + x`: 0 + x is not an identity for x = -0, so that costs an add.)
inline f32x16 splat(float x) { return f32x16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
// Lane permutation (GCC and Clang spell it differently).
template <int... I>
inline f32x16 permute(f32x16 v) {
#if defined(__clang__)
  return __builtin_shufflevector(v, v, I...);
#else
  return __builtin_shuffle(v, i32x16{I...});
#endif
}
// Horizontal reductions as a 4-step butterfly (log depth instead of a 15-long dependency chain), in a
// fixed order, so they are deterministic.
inline float reduce_max(f32x16 v) {
  v = vmax(v, permute<8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7>(v));
  v = vmax(v, permute<4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11>(v));
  v = vmax(v, permute<2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13>(v));
  v = vmax(v, permute<1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14>(v));
  return v[0];
}
inline float reduce_sum(f32x16 v) {
  v += permute<8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7>(v);
  v += permute<4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11>(v);
  v += permute<2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13>(v);
  v += permute<1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14>(v);
  return v[0];
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

}  // namespace LOOM_KERNEL_NS
}  // namespace simd

// y = softmax(x) over n for each (outer, inner). A row that is entirely -inf gives zeros (not NaN).
void softmax_forward(float* y, const float* x, int64_t outer, int64_t n, int64_t inner);
// dx = y * (dy - sum_n(dy * y)).
void softmax_backward(float* dx, const float* y, const float* dy, int64_t outer, int64_t n, int64_t inner);

}  // namespace loom::cpu
