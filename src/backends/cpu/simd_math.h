// Vectorisable f32 transcendental functions for the CPU kernels.
//
// Why not std::exp / std::erf: without -ffast-math GCC will not call glibc's vector math (libmvec), so
// a loop over std::exp stays scalar (~10x slower than the loop around it). These are branch-free scalar
// functions that `#pragma omp simd` loops vectorise into straight-line AVX-512 (or AVX2) code.
// Accuracy, measured against double-precision libm over the ranges the activations use (see
// tests/backends/cpu/simd_math_test.cpp): exp <= 1.1 ulp, sigmoid <= 2.3 ulp, erf <= 3.4e-7 absolute
// (a few ulp of 1 where erf saturates, |x| > 3).
#pragma once

#include <bit>
#include <cstdint>

#include "backends/cpu/kernel_isa.h"
#include "core/dtype.h"

namespace loom::cpu::simd {
inline namespace LOOM_KERNEL_NS {  // one copy per instruction set: kernel_isa.h

// e^x. Cephes expf (S. Moshier): x = n*ln2 + r with ln2 split in two for an exact reduction,
// e^r by a degree-6 polynomial on |r| <= ln2/2, 2^n assembled in the exponent bits.
// Underflows to 0 below -87.33 (no denormals) and overflows to +inf above 88.38 (a little before the
// true overflow at 88.72: 2^n with n = 128 is the inf bit pattern, which saves a select).
inline float exp(float x) {
  const float xc = x < -87.33654f ? -87.33654f : (x > 89.0f ? 89.0f : x);
  // Round x*log2(e) to the nearest integer by the 1.5*2^23 trick (exact in round-to-nearest mode).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.33654f ? 0.0f : er * two_n;
}

// 1 / (1 + e^-x). No special cases needed: e^-x overflows to inf for x < -88.4 (giving 0, where the
// true value is below 4e-39) and flushes to 0 for x > 87.3 (giving 1). Written without |x| and a final
// blend because the activation kernels are compute-bound on this (it saves ~25% of their time).
inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

// erf(x): a rational approximation x*P(x^2)/Q(x^2) on [-4, 4] (erf is +-1 in f32 beyond), the one
// Eigen and XLA use for f32 (generic_fast_erf_float).
inline float erf(float a) {
  const float x = a < -4.0f ? -4.0f : (a > 4.0f ? 4.0f : a);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return p / q;
}

// Element loads and stores that widen bf16 to f32 and round back (to nearest even, NaN kept quiet, as
// bf16::from_float), written so that they vectorise inside `omp simd` loops.
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) {
  return std::bit_cast<float>(static_cast<uint32_t>(p[i].bits) << 16);
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  p[i].bits = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace LOOM_KERNEL_NS
}  // namespace loom::cpu::simd
