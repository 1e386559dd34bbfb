// quantized_matmul's AVX-512 VNNI kernels: the AVX2 kernel bodies (kernels_x86.inc) with each block's
// vpmaddubsw + vpmaddwd pair replaced by one vpdpbusd (on 256-bit registers, AVX-512 VL), which
// halves the integer work per block. Selected at run time only where CPUID reports avx512vnni and
// avx512vl (Ice Lake, Sapphire Rapids, Zen 4 and later).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
// All other headers are included above: only what follows is compiled with AVX-512 enabled, and it has
// internal linkage, so no AVX-512 code can be picked by the linker for a shared inline function.
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
}  // namespace
#define LOOM_QUANT_TABLE_NAME avx512_vnni_kernels
#define LOOM_QUANT_ZMM 1  // the 16-row kernels on 512-bit registers (kernels_x86.inc: group_pair_rows)
#include "quant/kernels_x86.inc"
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
const KernelTable* avx512_vnni_kernels() { return nullptr; }
}  // namespace loom::quant::detail
#endif
