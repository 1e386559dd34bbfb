#include "backends/cpu/elementwise.h"

#include "core/error.h"
#include "core/parallel.h"

#include <immintrin.h>
#include <atomic>
#include <cstring>

namespace loom::cpu {

namespace {
constexpr int64_t kGrain = 1 << 15;
}

void add_forward(float* out, const float* a, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

void add_inplace(float* out, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] += b[i];
  });
}

void mul_forward(float* out, const float* a, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] * b[i];
  });
}

void scale_forward(float* out, const float* a, float scale, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] * scale;
  });
}

void axpby(float* out, float alpha, const float* a, float beta, const float* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = alpha * a[i] + beta * b[i];
  });
}

double sum(const float* a, int64_t n) {
  return parallel_reduce_chunks<double>(0, n, kGrain, 0.0, [&](int64_t s, int64_t e) {
    double acc = 0.0;
    for (int64_t i = s; i < e; ++i) acc += a[i];
    return acc;
  });
}

// ---- f32 -> bf16 -----------------------------------------------------------------------------------
//
// Three versions of one function, chosen once at run time by what the CPU has (not by the build's
// -march, so one binary is right on Zen 3, Zen 4/5 and Sapphire Rapids):
//   * AVX512-BF16: vcvtneps2bf16, 16 floats an instruction. It rounds to nearest even as the others do,
//     but treats denormal inputs as zero (the instruction's DAZ/FTZ): |x| < 2^-126 gives +-0 there.
//   * AVX2: the scalar rounding on 8 lanes with 32-bit integer ops (bits + 0x7fff + lsb, >> 16; NaN
//     keeps its top bits, made quiet), packed to 16 bits. Bitwise the scalar function, denormals included.
//   * scalar: bf16::from_float.
namespace {

void f32_to_bf16_scalar(const float* in, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16::from_float(in[i]);
}

__attribute__((target("avx2"))) inline __m256i f32_to_bf16_lanes_avx2(const float* in) {
  const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(in));
  const __m256i top = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  // |u| > inf's bits: a NaN (the compare is signed, but |u| < 2^31).
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);  // each lane in [0, 0xffff]
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* in, bf16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus works within 128-bit halves: [a0..3 b0..3 | a4..7 b4..7]; the permute restores the order.
    const __m256i packed = _mm256_packus_epi32(f32_to_bf16_lanes_avx2(in + i), f32_to_bf16_lanes_avx2(in + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i lanes = f32_to_bf16_lanes_avx2(in + i);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  f32_to_bf16_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx512f,avx512bf16"))) void f32_to_bf16_avx512bf16(const float* in, bf16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    std::memcpy(static_cast<void*>(out + i), &v, 32);
  }
  f32_to_bf16_scalar(in + i, out + i, n - i);
}

using ConvertFn = void (*)(const float*, bf16*, int64_t);

ConvertFn convert_fn(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::Avx512Bf16: return f32_to_bf16_avx512bf16;
    case ConvertIsa::Avx2: return f32_to_bf16_avx2;
    case ConvertIsa::Scalar: break;
  }
  return f32_to_bf16_scalar;
}

ConvertIsa best_convert_isa() {
  if (convert_isa_available(ConvertIsa::Avx512Bf16)) return ConvertIsa::Avx512Bf16;
  if (convert_isa_available(ConvertIsa::Avx2)) return ConvertIsa::Avx2;
  return ConvertIsa::Scalar;
}

// Function-local: chosen on first use, whatever the order of static initialisers across files.
ConvertFn active_convert_fn() {
  static const ConvertFn fn = convert_fn(best_convert_isa());
  return fn;
}

}  // namespace

bool convert_isa_available(ConvertIsa isa) {
  __builtin_cpu_init();  // needed before __builtin_cpu_supports when called from a static initialiser
  switch (isa) {
    case ConvertIsa::Avx512Bf16: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    case ConvertIsa::Avx2: return __builtin_cpu_supports("avx2");
    case ConvertIsa::Scalar: return true;
  }
  return false;
}

const char* convert_isa_name(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::Avx512Bf16: return "avx512bf16";
    case ConvertIsa::Avx2: return "avx2";
    case ConvertIsa::Scalar: return "scalar";
  }
  return "?";
}

ConvertIsa active_convert_isa() { return best_convert_isa(); }

void convert_f32_to_bf16_with(ConvertIsa isa, const float* in, bf16* out, int64_t n) {
  LOOM_CHECK(convert_isa_available(isa), "convert_f32_to_bf16: this CPU lacks ", convert_isa_name(isa));
  convert_fn(isa)(in, out, n);
}

void convert_f32_to_bf16_serial(const float* in, bf16* out, int64_t n) { active_convert_fn()(in, out, n); }

namespace {
std::atomic<int64_t> g_convert_passes{0}, g_convert_elements{0};
}  // namespace

ConvertStats convert_stats() { return {g_convert_passes.load(), g_convert_elements.load()}; }

void convert_f32_to_bf16(const float* in, bf16* out, int64_t n) {
  g_convert_passes.fetch_add(1, std::memory_order_relaxed);
  g_convert_elements.fetch_add(n, std::memory_order_relaxed);
  const ConvertFn fn = active_convert_fn();
  parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) { fn(in + s, out + s, e - s); });
}

}  // namespace loom::cpu
