// Philox4x32-10 random words, 64 at a time, for the kernels that draw dropout masks (activation.inc's
// dropout, attention.inc's dropout on the attention probabilities).
//
// The same rounds as core/rng.cpp's philox4x32, which stays the definition: element i of a stream is
// random_bits(key, i) = word i % 4 of the block with counter i / 4. The tests check the kernels' masks
// against random_uniform bit for bit (tests/ops/dropout_test.cpp, tests/ops/attention_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cpu/kernel_isa.h"

#if LOOM_KERNEL_ISA >= 3
// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics at -O3 (GCC bug
// 105593, the _mm512_undefined_* placeholders, reported where they are inlined, so in the files that
// include this header); the intrinsics themselves are fine.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#elif LOOM_KERNEL_ISA == 2
#include <immintrin.h>
#endif

namespace loom::cpu::philox {
inline namespace LOOM_KERNEL_NS {  // one copy per instruction set: kernel_isa.h

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// One block (four words) of the stream, scalar: the portable path of philox_tile below.
inline void philox_block(uint64_t block, uint32_t key0, uint32_t key1, uint32_t& o0, uint32_t& o1,
                         uint32_t& o2, uint32_t& o3) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  o0 = c0;
  o1 = c1;
  o2 = c2;
  o3 = c3;
}

// 64 random words, element order, for elements 4*first .. 4*first + 63 (blocks first .. first + 15);
// `first` must be a multiple of 16 so that the low counter word does not carry within the tile.
#if LOOM_KERNEL_ISA >= 3
// AVX-512: 16 blocks side by side, one per lane. The 32x32->64-bit products come from vpmuludq on the
// even and (shifted) odd lanes; GCC's own vectorisation of philox_block widens to 64-bit lanes and uses
// the slow vpmullq. The four output words are then transposed into element order.
inline void philox_tile(uint64_t first, uint32_t key0, uint32_t key1, uint32_t* bits) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))), lane);
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  __m512i k0 = _mm512_set1_epi32(static_cast<int>(key0)), k1 = _mm512_set1_epi32(static_cast<int>(key1));
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0)), m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m512i w0 = _mm512_set1_epi32(static_cast<int>(kPhiloxW0)), w1 = _mm512_set1_epi32(static_cast<int>(kPhiloxW1));
  constexpr __mmask16 kOdd = 0xAAAA;
  for (int round = 0; round < 10; ++round) {
    const __m512i pe0 = _mm512_mul_epu32(c0, m0), po0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
    const __m512i pe1 = _mm512_mul_epu32(c2, m1), po1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
    const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, pe0, _mm512_slli_epi64(po0, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(pe0, 32), po0);
    const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, pe1, _mm512_slli_epi64(po1, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(pe1, 32), po1);
    c0 = _mm512_ternarylogic_epi32(hi1, c1, k0, 0x96);  // hi1 ^ c1 ^ k0
    c2 = _mm512_ternarylogic_epi32(hi0, c3, k1, 0x96);  // hi0 ^ c3 ^ k1
    c1 = lo1;
    c3 = lo0;
    k0 = _mm512_add_epi32(k0, w0);
    k1 = _mm512_add_epi32(k1, w1);
  }
  // c_j lane b holds word j of block b; element 4b + j wants it. 4x4 transpose of 32-bit words within
  // each 128-bit lane, then of 128-bit lanes across the four registers.
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);  // blocks 0,4,8,12 | 1,5,9,13
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);  // blocks 2,6,10,14 | 3,7,11,15
  const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);  // 0,4,1,5 | 2,6,3,7
  const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);  // 8,12,9,13 | 10,14,11,15
  _mm512_storeu_si512(bits, _mm512_shuffle_i32x4(v0, v1, 0x88));       // blocks 0..3
  _mm512_storeu_si512(bits + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));  // blocks 4..7
  _mm512_storeu_si512(bits + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));  // blocks 8..11
  _mm512_storeu_si512(bits + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));  // blocks 12..15
}
#elif LOOM_KERNEL_ISA == 2
// AVX2: the same, 8 blocks per ymm, two halves of the tile (the scalar loop costs attention with
// dropout ~30% of its time on Zen 3). Blends take the odd lanes' products; the transpose is per half.
inline void philox_tile(uint64_t first, uint32_t key0, uint32_t key1, uint32_t* bits) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0)), m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(kPhiloxW0)), w1 = _mm256_set1_epi32(static_cast<int>(kPhiloxW1));
  for (int half = 0; half < 2; ++half) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first) + 8u * half)), lane);
    __m256i c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    __m256i k0 = _mm256_set1_epi32(static_cast<int>(key0)), k1 = _mm256_set1_epi32(static_cast<int>(key1));
    for (int round = 0; round < 10; ++round) {
      const __m256i pe0 = _mm256_mul_epu32(c0, m0), po0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i pe1 = _mm256_mul_epu32(c2, m1), po1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xAA);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
      c1 = lo1;
      c3 = lo0;
      k0 = _mm256_add_epi32(k0, w0);
      k1 = _mm256_add_epi32(k1, w1);
    }
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  // blocks 0,4 | 1,5
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  // blocks 2,6 | 3,7
    uint32_t* out = bits + 32 * half;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(u0, u1, 0x20));       // 0, 1
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_permute2x128_si256(u2, u3, 0x20));   // 2, 3
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(u0, u1, 0x31));  // 4, 5
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 24), _mm256_permute2x128_si256(u2, u3, 0x31));  // 6, 7
  }
}
#else
inline void philox_tile(uint64_t first, uint32_t key0, uint32_t key1, uint32_t* bits) {
  for (int k = 0; k < 16; ++k) {
    philox_block(first + static_cast<uint64_t>(k), key0, key1, bits[4 * k], bits[4 * k + 1], bits[4 * k + 2],
                 bits[4 * k + 3]);
  }
}
#endif

// Element i is dropped iff random_uniform(key, i) = (bits >> 8) * 2^-24 < p, i.e. iff the integer
// (bits >> 8) < ceil(p * 2^24): the comparison is exact, so the mask matches random_uniform bit for bit.
inline uint32_t drop_threshold(float p) { return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0)); }

}  // namespace LOOM_KERNEL_NS
}  // namespace loom::cpu::philox
