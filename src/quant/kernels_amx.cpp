// quantized_matmul's AMX path: the AVX-512 VNNI kernels (kernels_x86.inc, as kernels_avx512_vnni.cpp
// builds them) whose 16-row pair groups take AMX int8 tiles (tdpbssd) for the integer dots when a call
// has enough activation rows (kAmxMinRows; the amx_pairs section of kernels_x86.inc). Selected at run
// time only where CPUID reports amx-tile and amx-int8 and the OS grants the tile state (qmatmul.cpp;
// Sapphire Rapids and later). The tile instructions are inline assembly: no -mamx flags are needed,
// and nothing here runs on a CPU without them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
// As in kernels_avx512_vnni.cpp: every header above, only the kernels below compiled for AVX-512.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#endif
#include <immintrin.h>

namespace loom::quant::detail {
namespace {
constexpr bool kVnni = true;
inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
// Activation rows (tokens x rounding levels) from which a call's pair groups go through the tiles,
// where they measured faster (bench/qmatmul.cpp, one thread, both paths interleaved in one run; docs/
// quant.md): the 4-bit formats from 16 rows (at 8 no faster, at 4 ~40% slower: a tile of 16 rows costs
// the same whatever rows it holds), Q8_0, whose VNNI kernel pays for the sign trick, from 8. Below, the
// VNNI kernels; the same bits either way.
constexpr int64_t kAmxMinRows = 16, kAmxMinRowsQ8 = 8;
}  // namespace
#define LOOM_QUANT_TABLE_NAME amx_kernels
#define LOOM_QUANT_ZMM 1
#define LOOM_QUANT_AMX 1
#include "quant/kernels_x86.inc"
#undef LOOM_QUANT_AMX
#undef LOOM_QUANT_ZMM
#undef LOOM_QUANT_TABLE_NAME
}  // namespace loom::quant::detail
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
namespace loom::quant::detail {
const KernelTable* amx_kernels() { return nullptr; }
}  // namespace loom::quant::detail
#endif
