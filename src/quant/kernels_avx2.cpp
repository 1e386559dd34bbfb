// quantized_matmul's AVX2 kernels (+ FMA, F16C): integer block dot products by vpmaddubsw + vpmaddwd.
// The kernel bodies are shared with the AVX-512 VNNI path: kernels_x86.inc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
// Every standard and loom header is included above this line, so only the kernels below are compiled
// for AVX2 (a build without -march=native still runs the scalar path on an older CPU).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>

namespace loom::quant::detail {
namespace {
constexpr bool kVnni = false;
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi32(acc, dot_u8s8(u, s)); }
}  // namespace
#define LOOM_QUANT_TABLE_NAME avx2_kernels
#include "quant/kernels_x86.inc"
#undef LOOM_QUANT_TABLE_NAME
}  // namespace loom::quant::detail
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
namespace loom::quant::detail {
const KernelTable* avx2_kernels() { return nullptr; }
}  // namespace loom::quant::detail
#endif
