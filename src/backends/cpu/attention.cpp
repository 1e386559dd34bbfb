// Attention kernels (see attention.h for the contract and the legend).
//
// Flash kernels (Dao, "FlashAttention-2", 2023), per head:
//   * K and V rows are packed once per head into thread-local scratch, RoPE'd on the way in, zero-
//     padded to multiples of 16 in both T and D, so every inner loop runs on whole 16-float vectors
//     and padding contributes exact zeros. K^T (and V^T in the backward) are packed too, so that
//     Q K^T and dO V^T vectorise over keys. These [T, D]-sized packs are the only copies made.
//   * Scores live in the log2 domain: Q is pre-multiplied by scale*log2(e), so probabilities are
//     exp2(S - m), as the FlashAttention-2 kernels do (softmax_scale_log2).
//   * All products go through one register-tiled micro-GEMM: C[M x N] (+)= A B with N a multiple of
//     16, an 8 x 32 tile of accumulators (6 x 16 in ymm registers on AVX2 builds, which have 16 vector
//     registers, not 32), B rows loaded as vectors and A elements broadcast. A may be
//     read transposed (P^T dO, dS^T Q) through its strides, so P^T and dS^T are never formed.
//   * Causal diagonal blocks are trimmed per 8-row tile (for_each_row_tile): work beyond a tile's
//     last visible key is skipped rather than computed and masked.
//   * The backward recomputes P blockwise from the saved logsumexp and accumulates dQ, dK and dV for a
//     head in that head's thread, in a fixed order: bitwise deterministic for any thread count.
//   * Dropout on the probabilities (Dao et al., "FlashAttention", 2022, Algorithms 2 and 4): the forward
//     accumulates the row sum l from the undropped exponentials, then zeroes the dropped ones before
//     P V, and folds 1/(1-p) into the final 1/l. The backward redraws the same keep mask per block
//     (drop_row) and, with Z = keep/(1-p):  dV += (Z o P)^T dO;  dS = P o (Z o dP~ - D_i) =
//     (Z o P) o dP~ - P D_i, where dP~ = dO V^T and D_i = dO_i . O_i with O the dropped output.
//     Without dropout (p = 0) none of this runs: the same instructions, the same bits as before.
#include "backends/cpu/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>  // the AVX2 micro-kernel and score rows
#endif

#include "backends/cpu/philox.h"
#include "backends/cpu/rope.h"
#include "backends/cpu/softmax.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

using simd::f32x16;

constexpr int64_t kBlockQ = 32;  // query rows per block
constexpr int64_t kBlockK = 128;  // keys per block (a multiple of 64: see drop_row)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Float scratch owned by one thread, from the CPU caching allocator: 64-byte aligned, counted in the
// allocator's statistics (so tests can check the memory bound), and reused from its free lists after
// the first training step.
class Buffer {
 public:
  explicit Buffer(int64_t n)
      : bytes_(static_cast<size_t>(std::max<int64_t>(n, 16)) * sizeof(float)),
        data_(static_cast<float*>(allocator_for(Device::cpu()).allocate(bytes_))) {}
  ~Buffer() { allocator_for(Device::cpu()).deallocate(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() const { return data_; }

 private:
  size_t bytes_;
  float* data_;
};
Buffer make_buffer(int64_t n) { return Buffer(n); }

const float* row_of(const float* base, const HeadLayout& l, int64_t b, int64_t h, int64_t t) {
  return base + b * l.batch_stride + h * l.head_stride + t * l.row_stride;
}
float* row_of(float* base, const HeadLayout& l, int64_t b, int64_t h, int64_t t) {
  return base + b * l.batch_stride + h * l.head_stride + t * l.row_stride;
}

// ---- the micro-GEMM ----------------------------------------------------------------------------
// C[M x N] (+)= A[M x K] B[K x N]; A(m, k) = a[m*sam + k*sak]; B row-major with ldb; N % 16 == 0.

template <int MR, int NV, bool kAccumulate>
void gemm_tile(float* c, int64_t ldc, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
               int64_t kdim) {
  f32x16 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[m][v] = kAccumulate ? simd::load(c + m * ldc + 16 * v) : f32x16{};
  for (int64_t kk = 0; kk < kdim; ++kk) {
    f32x16 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = simd::load(b + kk * ldb + 16 * v);
    const float* ak = a + kk * sak;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const f32x16 av = simd::splat(ak[m * sam]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[m][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) simd::store(c + m * ldc + 16 * v, acc[m][v]);
}

using TileFn = void (*)(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t);

template <bool kAccumulate, int... MRs>
constexpr std::array<TileFn, 2 * sizeof...(MRs)> make_tiles(std::integer_sequence<int, MRs...>) {
  return {&gemm_tile<MRs + 1, 1, kAccumulate>..., &gemm_tile<MRs + 1, 2, kAccumulate>...};
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// The AVX2 build: a 16-float f32x16 is two ymm, so the 8 x 32 tile above needs 32 accumulator registers
// of the 16 there are, and GCC spills them and builds its broadcasts through the stack (~14 memory
// operations per FMA at D = 32). This 6 x 16 tile keeps 12 ymm accumulators, 2 B vectors and one
// broadcast in registers. Each element still sums its k products in order with one FMA each, so the
// results are bitwise those of the generic tile.
template <int MR, bool kAccumulate>
void gemm_tile_avx2(float* c, int64_t ldc, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
                    int64_t kdim) {
  __m256 lo[MR], hi[MR];
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
    lo[m] = kAccumulate ? _mm256_loadu_ps(c + m * ldc) : _mm256_setzero_ps();
    hi[m] = kAccumulate ? _mm256_loadu_ps(c + m * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < kdim; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * ldb), b1 = _mm256_loadu_ps(b + kk * ldb + 8);
    const float* ak = a + kk * sak;
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_broadcast_ss(ak + m * sam);
      lo[m] = _mm256_fmadd_ps(av, b0, lo[m]);
      hi[m] = _mm256_fmadd_ps(av, b1, hi[m]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(c + m * ldc, lo[m]);
    _mm256_storeu_ps(c + m * ldc + 8, hi[m]);
  }
}

template <bool kAccumulate, int... MRs>
constexpr std::array<TileFn, sizeof...(MRs)> make_avx2_tiles(std::integer_sequence<int, MRs...>) {
  return {&gemm_tile_avx2<MRs + 1, kAccumulate>...};
}

template <bool kAccumulate>
void gemm(float* c, int64_t ldc, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
          int64_t m, int64_t n, int64_t kdim) {
  static constexpr auto tiles = make_avx2_tiles<kAccumulate>(std::make_integer_sequence<int, 6>{});
  for (int64_t m0 = 0; m0 < m; m0 += 6) {
    const int mr = static_cast<int>(std::min<int64_t>(6, m - m0));
    for (int64_t n0 = 0; n0 < n; n0 += 16)
      tiles[static_cast<size_t>(mr - 1)](c + m0 * ldc + n0, ldc, a + m0 * sam, sam, sak, b + n0, ldb, kdim);
  }
}
#else
template <bool kAccumulate>
void gemm(float* c, int64_t ldc, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
          int64_t m, int64_t n, int64_t kdim) {
  static constexpr auto tiles = make_tiles<kAccumulate>(std::make_integer_sequence<int, 8>{});
  for (int64_t m0 = 0; m0 < m; m0 += 8) {
    const int mr = static_cast<int>(std::min<int64_t>(8, m - m0));
    for (int64_t n0 = 0; n0 < n; n0 += 32) {
      const int nv = n - n0 >= 32 ? 2 : 1;
      tiles[static_cast<size_t>((nv - 1) * 8 + mr - 1)](c + m0 * ldc + n0, ldc, a + m0 * sam, sam, sak, b + n0, ldb,
                                                        kdim);
    }
  }
}
#endif

// ---- score rows ----------------------------------------------------------------------------------
// row_max(s, n) = max(s[0..n)); exp2_row(s, n, m): s[j] = exp2(s[j] - m) in place, returning the sum of
// the new s[j] (summed as 16 lanes, then simd::reduce_sum's butterfly). n % 16 == 0.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// On AVX2, GCC lowers simd::exp2 on f32x16 to scalar compares and blends through the stack; these are the
// same operations on two ymm halves (clamps as max/min that keep a NaN; the same FMA polynomial), so the
// values and the summation order, hence the bits, are those of the generic path.
inline __m256 exp2_avx2(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-126.0f), x);  // max/min return x when x is NaN
  x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(x, n), _mm256_set1_ps(0.6931471805599453f));
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(underflow, r);
}

float row_max(const float* s, int64_t n) {
  __m256 lo = _mm256_set1_ps(-kInf), hi = lo;
  for (int64_t j = 0; j < n; j += 16) {
    lo = _mm256_max_ps(lo, _mm256_loadu_ps(s + j));
    hi = _mm256_max_ps(hi, _mm256_loadu_ps(s + j + 8));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_max_ps(lo, hi));
  return std::max(std::max(std::max(t[0], t[1]), std::max(t[2], t[3])), std::max(std::max(t[4], t[5]), std::max(t[6], t[7])));
}

float exp2_row(float* s, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  for (int64_t j = 0; j < n; j += 16) {
    const __m256 e0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    const __m256 e1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mv));
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  // reduce_sum's butterfly: lanes l and l+8, then l and l+4, l+2, l+1.
  __m256 v = _mm256_add_ps(lo, hi);
  v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4E));
  v = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
  return _mm256_cvtss_f32(v);
}
#else
float row_max(const float* s, int64_t n) {
  f32x16 vm = simd::splat(-kInf);
  for (int64_t j = 0; j < n; j += 16) vm = simd::vmax(vm, simd::load(s + j));
  return simd::reduce_max(vm);
}

float exp2_row(float* s, int64_t n, float m) {
  const f32x16 mv = simd::splat(m);
  f32x16 vs{};
  for (int64_t j = 0; j < n; j += 16) {
    const f32x16 e = simd::exp2(simd::load(s + j) - mv);
    simd::store(s + j, e);
    vs += e;
  }
  return simd::reduce_sum(vs);
}
#endif

// ---- packing -------------------------------------------------------------------------------------

// Copies row t of an operand into dst[0..width) (zero-padded), applying RoPE when `rope` is set.
void load_row(float* dst, int64_t width, const float* src, int64_t d, const RopeTables* rope, int64_t b,
              int64_t t) {
  if (rope != nullptr) {
    const int64_t r = b * rope->batch_stride + t;
    rope_rotate_row(dst, src, rope->cos + r * (d / 2), rope->sin + r * (d / 2), d, rope->interleaved, false);
  } else {
    std::copy(src, src + d, dst);
  }
  std::fill(dst + d, dst + width, 0.0f);
}

// The causal/padding limit: how many of the wp columns starting at key j0 row i may see.
int64_t visible_columns(const AttentionProblem& p, int64_t i, int64_t j0, int64_t wp) {
  int64_t limit = std::min(wp, p.tk - j0);
  if (p.causal) limit = std::min(limit, i + (p.tk - p.tq) + 1 - j0);
  return std::max<int64_t>(limit, 0);
}

// Calls fn(r0, mr, cols) for the 8-row tiles (the micro-GEMM's height) of a [rows, wp] score block;
// cols is what the tile's last row may see, rounded up to 16: under the causal rule the diagonal block
// is a triangle, and products beyond cols would only be masked away.
template <typename Fn>
void for_each_row_tile(const AttentionProblem& p, int64_t i0, int64_t rows, int64_t j0, int64_t wp, Fn&& fn) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t mr = std::min<int64_t>(8, rows - r0);
    const int64_t cols = std::min(wp, round16(visible_columns(p, i0 + r0 + mr - 1, j0, wp)));
    if (cols > 0) fn(r0, mr, cols);
  }
}

// Keys [0, kend) hold every key visible to query rows [i0, i0 + rows).
int64_t key_end(const AttentionProblem& p, int64_t i0, int64_t rows) {
  if (!p.causal) return p.tk;
  return std::clamp<int64_t>(i0 + rows + (p.tk - p.tq), 0, p.tk);
}

struct Dims {
  int64_t dp, dvp, tkp;
  explicit Dims(const AttentionProblem& p) : dp(round16(p.d)), dvp(round16(p.dv)), tkp(round16(p.tk)) {}
};

// The operands are read a head at a time with a row stride of H*D floats (2 KiB at the model's shape),
// which hardware prefetchers do not follow across pages: prefetch a few rows ahead explicitly.
constexpr int64_t kPrefetchRows = 16;
void prefetch_row(const float* p, int64_t n) {
  for (int64_t x = 0; x < n; x += 16) __builtin_prefetch(p + x);
  __builtin_prefetch(p + n - 1);
}
// The same for rows about to be written (prefetch with intent to write).
void prefetch_row_for_write(float* p, int64_t n) {
  for (int64_t x = 0; x < n; x += 16) __builtin_prefetch(p + x, 1);
  __builtin_prefetch(p + n - 1, 1);
}

#if !defined(__clang__)  // GCC's two-source __builtin_shuffle; Clang takes the scalar transpose below
// Two-source lane masks for one stage of a 16x16 transpose (see transpose16).
template <int K>
constexpr simd::i32x16 swap_mask(bool upper) {
  simd::i32x16 m{};
  for (int l = 0; l < 16; ++l) {
    if (!upper) m[l] = (l & K) == 0 ? l : 16 + l - K;
    else m[l] = (l & K) == 0 ? l + K : 16 + l;
  }
  return m;
}

template <int K>
inline void transpose_stage(f32x16* r) {
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i & K) continue;
    const f32x16 a = r[i], b = r[i + K];
    r[i] = __builtin_shuffle(a, b, swap_mask<K>(false));
    r[i + K] = __builtin_shuffle(a, b, swap_mask<K>(true));
  }
}

// One 16x16 block: dst[c * ld_dst + j] = src[j * ld_src + c]. Recursive block transpose: each stage
// swaps the off-diagonal K x K sub-blocks of every 2K x 2K block (K = 8, 4, 2, 1), 64 lane permutes
// in all instead of 256 scalar loads and stores.
inline void transpose16(float* dst, int64_t ld_dst, const float* src, int64_t ld_src) {
  f32x16 r[16];
  for (int i = 0; i < 16; ++i) r[i] = simd::load(src + i * ld_src);
  transpose_stage<8>(r);
  transpose_stage<4>(r);
  transpose_stage<2>(r);
  transpose_stage<1>(r);
  for (int i = 0; i < 16; ++i) simd::store(dst + i * ld_dst, r[i]);
}
#endif

// dst[c * ld_dst + j] = src[j * ld_src + c] for j < rows, c < cols (an in-cache transpose).
void transpose(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
#if !defined(__clang__)
  if (rows % 16 == 0 && cols % 16 == 0) {
    for (int64_t j = 0; j < rows; j += 16)
      for (int64_t c = 0; c < cols; c += 16) transpose16(dst + c * ld_dst + j, ld_dst, src + j * ld_src + c, ld_src);
    return;
  }
#endif
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t j = 0; j < rows; ++j) dst[c * ld_dst + j] = src[j * ld_src + c];
}

// Rows [0, t) of an operand into dst [Tkp, width] (zero-padded rows and columns), roped if asked.
void pack_rows(float* dst, int64_t width, int64_t padded_rows, const float* base, const HeadLayout& l, int64_t t,
               int64_t d, const RopeTables* rope, int64_t b, int64_t h) {
  for (int64_t j = 0; j < t; ++j) {
    if (j + kPrefetchRows < t) prefetch_row(row_of(base, l, b, h, j + kPrefetchRows), d);
    load_row(dst + j * width, width, row_of(base, l, b, h, j), d, rope, b, j);
  }
  std::fill(dst + t * width, dst + padded_rows * width, 0.0f);
}

// Keys [0, nk): krows [round16(nk), Dp] (roped, row-major) and kt [Dp, Tkp] (its transpose, columns
// [0, round16(nk)) written), both zero-padded.
void pack_keys(const AttentionProblem& p, const Dims& s, const float* k, int64_t b, int64_t h, int64_t nk,
               float* kt, float* krows) {
  const RopeTables* rope = p.rope.cos != nullptr ? &p.rope : nullptr;
  pack_rows(krows, s.dp, round16(nk), k, p.k, nk, p.d, rope, b, h);
  transpose(kt, s.tkp, krows, s.dp, round16(nk), s.dp);
}

// Queries [rows, Dp], roped and multiplied by scale*log2(e).
void pack_queries(const AttentionProblem& p, const Dims& s, const float* q, int64_t b, int64_t h, int64_t i0,
                  int64_t rows, float* qc) {
  const RopeTables* rope = p.rope.cos != nullptr ? &p.rope : nullptr;
  const float c = p.scale * kLog2e;
  for (int64_t r = 0; r < rows; ++r) {
    if (i0 + r + kPrefetchRows < p.tq) prefetch_row(row_of(q, p.q, b, h, i0 + r + kPrefetchRows), p.d);
    float* dst = qc + r * s.dp;
    load_row(dst, s.dp, row_of(q, p.q, b, h, i0 + r), p.d, rope, b, i0 + r);
    for (int64_t x = 0; x < p.d; ++x) dst[x] *= c;
  }
}

// Sets the scores that row i may not see to -inf: columns [visible, wp).
void mask_scores(const AttentionProblem& p, float* s, int64_t ld, int64_t i0, int64_t rows, int64_t j0,
                 int64_t wp) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t vis = visible_columns(p, i0 + r, j0, wp);
    std::fill(s + r * ld + vis, s + r * ld + wp, -kInf);
  }
}

// ---- dropout on the probabilities ----------------------------------------------------------------

// What the kernels need to apply p.dropout_p; keep = (random bits >> 8) >= threshold, the exact integer
// form of !(random_uniform < p) (philox.h).
struct DropoutRule {
  uint32_t threshold = 0;
  float keep_scale = 1.0f;  // 1 / (1 - p)
  explicit DropoutRule(const AttentionProblem& p)
      : threshold(philox::drop_threshold(p.dropout_p)), keep_scale(1.0f / (1.0f - p.dropout_p)) {}
};

// One row of a probability block, query i of head n, keys [j0, j0 + cols): dst[j] = keep(n, i, j0 + j) ?
// src[j] * scale : 0 (src == dst allowed). j0 is a multiple of kBlockK and rows start 64-aligned in the
// stream (attention_dropout_counter), so the draws are whole Philox tiles starting at the row's first key.
// Out of line: inlined, its Philox rounds bloat the heads' hot loops, which the p == 0 path also runs.
[[gnu::noinline]] void drop_row(const AttentionProblem& p, const DropoutRule& rule, int64_t n, int64_t i, int64_t j0, int64_t cols,
              const float* src, float* dst, float scale) {
  static_assert(kBlockK % 64 == 0, "key blocks must start on a 64-word Philox tile");
  alignas(64) uint32_t bits[64];
  const uint64_t first = attention_dropout_counter(p, n, i, j0);
  for (int64_t t = 0; t < cols; t += 64) {
    philox::philox_tile((first + static_cast<uint64_t>(t)) / 4, p.dropout_key.k0, p.dropout_key.k1, bits);
    const int64_t m = std::min<int64_t>(64, cols - t);
    for (int64_t j = 0; j < m; ++j) dst[t + j] = (bits[j] >> 8) >= rule.threshold ? src[t + j] * scale : 0.0f;
  }
}

// ---- flash forward -------------------------------------------------------------------------------

struct ForwardScratch {
  Buffer kt, krows, vp, qc, s, o, tmp;
  std::vector<float> m, l;
  ForwardScratch(const AttentionProblem& p, const Dims& d)
      : kt(make_buffer(d.dp * d.tkp)), krows(make_buffer(d.tkp * d.dp)), vp(make_buffer(d.tkp * d.dvp)),
        qc(make_buffer(kBlockQ * d.dp)),
        s(make_buffer(kBlockQ * kBlockK)), o(make_buffer(kBlockQ * d.dvp)), tmp(make_buffer(d.dp)),
        m(kBlockQ), l(kBlockQ) {}
};

// Query rows [row_begin, row_end) of head n (row_begin a multiple of kBlockQ).
void flash_forward_head(const AttentionProblem& p, const Dims& dims, int64_t n, int64_t row_begin, int64_t row_end,
                        const float* q, const float* k, const float* v, float* out, float* lse, ForwardScratch& w) {
  const int64_t b = n / p.heads_per_batch, h = n % p.heads_per_batch, hk = h / p.kv_group;
  const int64_t dp = dims.dp, dvp = dims.dvp;
  const int64_t nk = key_end(p, row_begin, row_end - row_begin);  // keys any of these rows can see
  const bool dropout = p.dropout_p > 0.0f;
  const DropoutRule rule(p);
  pack_keys(p, dims, k, b, hk, nk, w.kt.get(), w.krows.get());
  float* vp = w.vp.get();
  pack_rows(vp, dvp, round16(nk), v, p.v, nk, p.dv, nullptr, b, hk);

  float* qc = w.qc.get();
  float* s = w.s.get();
  float* o = w.o.get();
  for (int64_t i0 = row_begin; i0 < row_end; i0 += kBlockQ) {
    const int64_t rows = std::min(kBlockQ, row_end - i0);
    const int64_t kend = key_end(p, i0, rows);
    pack_queries(p, dims, q, b, h, i0, rows, qc);
    std::fill(w.m.begin(), w.m.end(), -kInf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    std::fill(o, o + rows * dvp, 0.0f);
    for (int64_t j0 = 0; j0 < kend; j0 += kBlockK) {
      const int64_t wp = round16(std::min(kBlockK, kend - j0));
      // s[rows, wp] = Qc K^T (log2 domain)
      for_each_row_tile(p, i0, rows, j0, wp, [&](int64_t r0, int64_t mr, int64_t cols) {
        gemm<false>(s + r0 * kBlockK, kBlockK, qc + r0 * dp, dp, 1, w.kt.get() + j0, dims.tkp, mr, cols, dp);
      });
      mask_scores(p, s, kBlockK, i0, rows, j0, wp);
      // Online softmax: rescale what was accumulated under the old row max, then add this block.
      for (int64_t r = 0; r < rows; ++r) {
        float* sr = s + r * kBlockK;
        const float m_new = std::max(w.m[r], row_max(sr, wp));
        if (m_new == -kInf) {  // no visible key yet: p = 0 (exp2(-inf) is exactly 0)
          std::fill(sr, sr + wp, 0.0f);
          continue;
        }
        const float alpha = std::exp2(w.m[r] - m_new);  // 0 on the first visible block
        w.l[r] = w.l[r] * alpha + exp2_row(sr, wp, m_new);  // the normaliser: before dropout
        // Dropped probabilities leave P V; 1/(1-p) is applied with 1/l at the end. Keys past the row's
        // visible ones are already exact zeros.
        if (dropout) drop_row(p, rule, n, i0 + r, j0, visible_columns(p, i0 + r, j0, wp), sr, sr, 1.0f);
        if (alpha != 1.0f) {
          float* orow = o + r * dvp;
          for (int64_t x = 0; x < dvp; ++x) orow[x] *= alpha;
        }
        w.m[r] = m_new;
      }
      // o[rows, Dvp] += P V
      for_each_row_tile(p, i0, rows, j0, wp, [&](int64_t r0, int64_t mr, int64_t cols) {
        gemm<true>(o + r0 * dvp, dvp, s + r0 * kBlockK, kBlockK, 1, vp + j0 * dvp, dvp, mr, dvp, cols);
      });
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (i0 + r + kPrefetchRows < p.tq) prefetch_row_for_write(row_of(out, p.out, b, h, i0 + r + kPrefetchRows), p.dv);
      float* dst = row_of(out, p.out, b, h, i0 + r);
      const float l = w.l[r];
      float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if (dropout) inv *= rule.keep_scale;
      for (int64_t x = 0; x < p.dv; ++x) dst[x] = o[r * dvp + x] * inv;
      lse[n * p.tq + i0 + r] = l > 0.0f ? w.m[r] + std::log2(l) : kInf;
    }
  }
}

// ---- flash backward ------------------------------------------------------------------------------

struct BackwardScratch {
  Buffer qc, kp, kt, vrows, vt, dop, dq, dk, dv, s, dpm, tmp;
  Buffer zp;  // Z o P for a block, with dropout only
  std::vector<float> di;
  BackwardScratch(const AttentionProblem& p, const Dims& d)
      : qc(make_buffer(p.tq * d.dp)), kp(make_buffer(d.tkp * d.dp)), kt(make_buffer(d.dp * d.tkp)),
        vrows(make_buffer(d.tkp * d.dvp)), vt(make_buffer(d.dvp * d.tkp)), dop(make_buffer(p.tq * d.dvp)), dq(make_buffer(p.tq * d.dp)),
        dk(make_buffer(d.tkp * d.dp)), dv(make_buffer(d.tkp * d.dvp)), s(make_buffer(kBlockQ * kBlockK)),
        dpm(make_buffer(kBlockQ * kBlockK)), tmp(make_buffer(std::max(d.dp, d.dvp))),
        zp(make_buffer(p.dropout_p > 0.0f ? kBlockQ * kBlockK : 0)), di(static_cast<size_t>(p.tq)) {}
};

// Query head n. The first head of a k/v group packs k and v and zeroes the dk/dv accumulators; every head
// of the group adds to them; the last one stores dk and dv.
void flash_backward_head(const AttentionProblem& p, const Dims& dims, int64_t n, const float* q, const float* k,
                         const float* v, const float* out, const float* dout, const float* lse, float* dq,
                         float* dk, float* dv, BackwardScratch& w) {
  const int64_t b = n / p.heads_per_batch, h = n % p.heads_per_batch, hk = h / p.kv_group;
  const bool first_of_group = h % p.kv_group == 0, last_of_group = h % p.kv_group == p.kv_group - 1;
  const int64_t dp = dims.dp, dvp = dims.dvp, tkp = dims.tkp;
  const RopeTables* rope = p.rope.cos != nullptr ? &p.rope : nullptr;
  const bool dropout = p.dropout_p > 0.0f;
  const DropoutRule rule(p);

  float* vt = w.vt.get();
  if (first_of_group) {
    pack_keys(p, dims, k, b, hk, p.tk, w.kt.get(), w.kp.get());
    pack_rows(w.vrows.get(), dvp, tkp, v, p.v, p.tk, p.dv, nullptr, b, hk);
    transpose(vt, tkp, w.vrows.get(), dvp, tkp, dvp);
  }
  pack_queries(p, dims, q, b, h, 0, p.tq, w.qc.get());
  float* dop = w.dop.get();
  for (int64_t i = 0; i < p.tq; ++i) {
    if (i + kPrefetchRows < p.tq) {
      prefetch_row(row_of(dout, p.out, b, h, i + kPrefetchRows), p.dv);
      prefetch_row(row_of(out, p.out, b, h, i + kPrefetchRows), p.dv);
    }
    const float* g = row_of(dout, p.out, b, h, i);
    const float* o = row_of(out, p.out, b, h, i);
    load_row(dop + i * dvp, dvp, g, p.dv, nullptr, b, i);
    float d = 0.0f;  // D_i = dO_i . O_i = sum_j P_ij dP_ij (O and dP~ with dropout: sum_j Z_ij P_ij dP~_ij)
    for (int64_t c = 0; c < p.dv; ++c) d += g[c] * o[c];
    w.di[static_cast<size_t>(i)] = d;
  }
  std::fill(w.dq.get(), w.dq.get() + p.tq * dp, 0.0f);
  if (first_of_group) {
    std::fill(w.dk.get(), w.dk.get() + tkp * dp, 0.0f);
    std::fill(w.dv.get(), w.dv.get() + tkp * dvp, 0.0f);
  }

  float* s = w.s.get();
  float* dpm = w.dpm.get();
  const float* qc = w.qc.get();
  for (int64_t i0 = 0; i0 < p.tq; i0 += kBlockQ) {
    const int64_t rows = std::min(kBlockQ, p.tq - i0);
    const int64_t kend = key_end(p, i0, rows);
    for (int64_t j0 = 0; j0 < kend; j0 += kBlockK) {
      const int64_t wp = round16(std::min(kBlockK, kend - j0));
      for_each_row_tile(p, i0, rows, j0, wp, [&](int64_t r0, int64_t mr, int64_t cols) {
        gemm<false>(s + r0 * kBlockK, kBlockK, qc + (i0 + r0) * dp, dp, 1, w.kt.get() + j0, tkp, mr, cols, dp);
      });
      mask_scores(p, s, kBlockK, i0, rows, j0, wp);
      // P = exp2(S - lse): masked scores (-inf) and rows without keys (lse = +inf) give exact zeros.
      for (int64_t r = 0; r < rows; ++r) {
        exp2_row(s + r * kBlockK, wp, lse[n * p.tq + i0 + r]);
      }
      // The probabilities that reached the output: P, or Z o P (zero past each row's visible keys: the
      // dV product below reads all wp columns).
      const float* pv = s;
      if (dropout) {
        float* zp = w.zp.get();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t vis = visible_columns(p, i0 + r, j0, wp);
          drop_row(p, rule, n, i0 + r, j0, vis, s + r * kBlockK, zp + r * kBlockK, rule.keep_scale);
          std::fill(zp + r * kBlockK + vis, zp + r * kBlockK + wp, 0.0f);
        }
        pv = zp;
      }
      // dV[j0.., Dvp] += P^T dO  (Z o P with dropout)
      gemm<true>(w.dv.get() + j0 * dvp, dvp, pv, 1, kBlockK, dop + i0 * dvp, dvp, wp, dvp, rows);
      // dP = dO V^T, then dS = P (dP - D_i); zero beyond each tile's columns (dK reads all wp).
      // With dropout dP is dP~ (the gradient of Z o P) and dS = (Z o P) dP~ - P D_i.
      for_each_row_tile(p, i0, rows, j0, wp, [&](int64_t r0, int64_t mr, int64_t cols) {
        gemm<false>(dpm + r0 * kBlockK, kBlockK, dop + (i0 + r0) * dvp, dvp, 1, vt + j0, tkp, mr, cols, dvp);
      });
      for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        const int64_t mr = std::min<int64_t>(8, rows - r0);
        const int64_t cols = std::min(wp, round16(visible_columns(p, i0 + r0 + mr - 1, j0, wp)));
        for (int64_t r = r0; r < r0 + mr; ++r) {
          float* pr = s + r * kBlockK;
          float* dr = dpm + r * kBlockK;
          const f32x16 dv_i = simd::splat(w.di[static_cast<size_t>(i0 + r)]);
          if (dropout) {
            const float* zr = pv + r * kBlockK;
            for (int64_t j = 0; j < cols; j += 16)
              simd::store(dr + j, simd::load(zr + j) * simd::load(dr + j) - simd::load(pr + j) * dv_i);
          } else {
            for (int64_t j = 0; j < cols; j += 16)
              simd::store(dr + j, simd::load(pr + j) * (simd::load(dr + j) - dv_i));
          }
          std::fill(dr + cols, dr + wp, 0.0f);
        }
      }
      // dQ[i0.., Dp] += dS K;  dK[j0.., Dp] += dS^T Qc
      for_each_row_tile(p, i0, rows, j0, wp, [&](int64_t r0, int64_t mr, int64_t cols) {
        gemm<true>(w.dq.get() + (i0 + r0) * dp, dp, dpm + r0 * kBlockK, kBlockK, 1, w.kp.get() + j0 * dp, dp, mr, dp,
                   cols);
      });
      gemm<true>(w.dk.get() + j0 * dp, dp, dpm, 1, kBlockK, qc + i0 * dp, dp, wp, dp, rows);
    }
  }

  // dq = scale * dS K; dk = (scale / (scale log2 e)) * dS^T Qc = ln2 * dS^T Qc; then undo RoPE.
  float* tmp = w.tmp.get();
  auto store_grad = [&](float* dst, const float* src, float factor, int64_t t) {
    for (int64_t c = 0; c < p.d; ++c) tmp[c] = src[c] * factor;
    if (rope != nullptr) {
      const int64_t r = b * rope->batch_stride + t;
      rope_rotate_row(dst, tmp, rope->cos + r * (p.d / 2), rope->sin + r * (p.d / 2), p.d, rope->interleaved, true);
    } else {
      std::copy(tmp, tmp + p.d, dst);
    }
  };
  for (int64_t i = 0; i < p.tq; ++i) {
    if (i + kPrefetchRows < p.tq) prefetch_row_for_write(row_of(dq, p.q, b, h, i + kPrefetchRows), p.d);
    store_grad(row_of(dq, p.q, b, h, i), w.dq.get() + i * dp, p.scale, i);
  }
  if (!last_of_group) return;
  for (int64_t j = 0; j < p.tk; ++j) {
    if (j + kPrefetchRows < p.tk) {
      prefetch_row_for_write(row_of(dk, p.k, b, hk, j + kPrefetchRows), p.d);
      prefetch_row_for_write(row_of(dv, p.v, b, hk, j + kPrefetchRows), p.dv);
    }
    store_grad(row_of(dk, p.k, b, hk, j), w.dk.get() + j * dp, kLn2, j);
    const float* src = w.dv.get() + j * dvp;
    std::copy(src, src + p.dv, row_of(dv, p.v, b, hk, j));
  }
}

// Heads per parallel chunk: several, so each chunk's scratch is allocated once, but enough chunks
// (4 per thread) to balance; all heads in one chunk when the whole problem is too small to be worth
// waking threads for. Chunking never changes results: heads are independent.
int64_t head_grain(const AttentionProblem& p) {
  const int64_t heads = p.heads();
  const double work = static_cast<double>(heads) * static_cast<double>(p.tq) * static_cast<double>(p.tk) *
                      static_cast<double>(p.d + p.dv);
  if (work < 1e6) return std::max<int64_t>(heads, 1);
  return std::max<int64_t>(1, heads / (4 * num_threads()));
}

// The same for work items that are whole k/v groups (kv_group query heads each).
int64_t kv_head_grain(const AttentionProblem& p) {
  return std::max<int64_t>(1, head_grain(p) / p.kv_group);
}

// ---- naive masked attention ------------------------------------------------------------------------

bool allowed(const AttentionProblem& p, const bool* mask_head, int64_t i, int64_t j) {
  if (p.causal && j > i + (p.tk - p.tq)) return false;
  return mask_head == nullptr || mask_head[i * p.tk + j];
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t x = 0; x < n; ++x) s += static_cast<double>(a[x]) * b[x];
  return s;
}

// prob[j] = softmax row i of head (b, h) given its saved natural-log lse.
void naive_probabilities(const AttentionProblem& p, const bool* mask_head, const float* q, const float* k,
                         int64_t b, int64_t h, int64_t i, double lse, std::vector<double>& prob) {
  const float* qi = row_of(q, p.q, b, h, i);
  for (int64_t j = 0; j < p.tk; ++j)
    prob[static_cast<size_t>(j)] = allowed(p, mask_head, i, j) && std::isfinite(lse)
                                       ? std::exp(p.scale * dot(qi, row_of(k, p.k, b, h / p.kv_group, j), p.d) - lse)
                                       : 0.0;
}

}  // namespace

void flash_attention_forward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                             float* out, float* lse) {
  LOOM_ASSERT(p.dropout_p >= 0.0f && p.dropout_p < 1.0f, "flash attention: dropout p=", p.dropout_p);
  if (p.heads() == 0 || p.tq == 0) return;
  const Dims dims(p);
  // Work items are (head, span of query blocks). With few heads (e.g. one long sequence) the query
  // blocks of a head are split into spans so that every thread has work; a row's result does not
  // depend on the split, so this stays deterministic.
  const int64_t qblocks = (p.tq + kBlockQ - 1) / kBlockQ;
  const int64_t grain = head_grain(p);
  int64_t spans = 1;
  if (grain < p.heads() && p.heads() < 4 * num_threads())
    spans = std::min(qblocks, (4 * num_threads() + p.heads() - 1) / p.heads());
  parallel_for(0, p.heads() * spans, spans == 1 ? grain : 1, [&](int64_t ib, int64_t ie) {
    ForwardScratch w(p, dims);
    for (int64_t item = ib; item < ie; ++item) {
      const int64_t n = item / spans, sp = item % spans;
      const int64_t rb = qblocks * sp / spans * kBlockQ, re = std::min(p.tq, qblocks * (sp + 1) / spans * kBlockQ);
      if (rb < re) flash_forward_head(p, dims, n, rb, re, q, k, v, out, lse, w);
    }
  });
}

void flash_attention_backward(const AttentionProblem& p, const float* q, const float* k, const float* v,
                              const float* out, const float* dout, const float* lse, float* dq, float* dk,
                              float* dv) {
  LOOM_ASSERT(p.dropout_p >= 0.0f && p.dropout_p < 1.0f, "flash attention: dropout p=", p.dropout_p);
  if (p.heads() == 0) return;
  const Dims dims(p);
  // One work item per k/v head: the query heads of a group run in order on one thread, accumulating dk/dv.
  const int64_t group = p.kv_group;
  parallel_for(0, p.kv_heads(), kv_head_grain(p), [&](int64_t gb, int64_t ge) {
    BackwardScratch w(p, dims);
    for (int64_t n = gb * group; n < ge * group; ++n)
      flash_backward_head(p, dims, n, q, k, v, out, dout, lse, dq, dk, dv, w);
  });
}

void masked_attention_forward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                              const float* q, const float* k, const float* v, float* out, float* lse) {
  LOOM_ASSERT(p.rope.cos == nullptr, "masked attention takes no fused RoPE");
  LOOM_ASSERT(p.dropout_p == 0.0f, "masked attention takes no dropout");
  parallel_for(0, p.heads(), head_grain(p), [&](int64_t nb, int64_t ne) {
    std::vector<double> score(static_cast<size_t>(p.tk)), acc(static_cast<size_t>(p.dv));
    for (int64_t n = nb; n < ne; ++n) {
      const int64_t b = n / p.heads_per_batch, h = n % p.heads_per_batch;
      const bool* mh = mask != nullptr ? mask + n * mask_head_stride : nullptr;
      const int64_t hk = h / p.kv_group;
      for (int64_t i = 0; i < p.tq; ++i) {
        const float* qi = row_of(q, p.q, b, h, i);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.tk; ++j) {
          score[j] = allowed(p, mh, i, j) ? p.scale * dot(qi, row_of(k, p.k, b, hk, j), p.d)
                                          : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, score[j]);
        }
        float* oi = row_of(out, p.out, b, h, i);
        if (mx == -std::numeric_limits<double>::infinity()) {
          std::fill(oi, oi + p.dv, 0.0f);
          lse[n * p.tq + i] = kInf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < p.tk; ++j) sum += (score[j] = std::exp(score[j] - mx));
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < p.tk; ++j) {
          if (score[j] == 0.0) continue;
          const float* vj = row_of(v, p.v, b, hk, j);
          for (int64_t c = 0; c < p.dv; ++c) acc[c] += score[j] / sum * vj[c];
        }
        for (int64_t c = 0; c < p.dv; ++c) oi[c] = static_cast<float>(acc[c]);
        lse[n * p.tq + i] = static_cast<float>(mx + std::log(sum));
      }
    }
  });
}

void masked_attention_backward(const AttentionProblem& p, const bool* mask, int64_t mask_head_stride,
                               const float* q, const float* k, const float* v, const float* dout,
                               const float* lse, float* dq, float* dk, float* dv) {
  LOOM_ASSERT(p.rope.cos == nullptr, "masked attention takes no fused RoPE");
  LOOM_ASSERT(p.dropout_p == 0.0f, "masked attention takes no dropout");
  // One work item per k/v head; its query heads run in order, accumulating dk/dv (see the flash backward).
  parallel_for(0, p.kv_heads(), kv_head_grain(p), [&](int64_t gb, int64_t ge) {
    std::vector<double> prob(static_cast<size_t>(p.tk)), ds(static_cast<size_t>(p.tk));
    std::vector<double> gq(static_cast<size_t>(p.d)), gk(static_cast<size_t>(p.tk * p.d)),
        gv(static_cast<size_t>(p.tk * p.dv));
    for (int64_t n = gb * p.kv_group; n < ge * p.kv_group; ++n) {
      const int64_t b = n / p.heads_per_batch, h = n % p.heads_per_batch, hk = h / p.kv_group;
      const bool* mh = mask != nullptr ? mask + n * mask_head_stride : nullptr;
      if (h % p.kv_group == 0) {
        std::fill(gk.begin(), gk.end(), 0.0);
        std::fill(gv.begin(), gv.end(), 0.0);
      }
      for (int64_t i = 0; i < p.tq; ++i) {
        naive_probabilities(p, mh, q, k, b, h, i, lse[n * p.tq + i], prob);
        const float* gi = row_of(dout, p.out, b, h, i);
        const float* qi = row_of(q, p.q, b, h, i);
        double di = 0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < p.tk; ++j) {
          ds[j] = dot(gi, row_of(v, p.v, b, hk, j), p.dv);  // dP_ij
          di += prob[j] * ds[j];
        }
        std::fill(gq.begin(), gq.end(), 0.0);
        for (int64_t j = 0; j < p.tk; ++j) {
          if (prob[j] == 0.0) continue;
          const double dsj = prob[j] * (ds[j] - di) * p.scale;
          const float* kj = row_of(k, p.k, b, hk, j);
          for (int64_t c = 0; c < p.d; ++c) {
            gq[c] += dsj * kj[c];
            gk[j * p.d + c] += dsj * qi[c];
          }
          for (int64_t c = 0; c < p.dv; ++c) gv[j * p.dv + c] += prob[j] * gi[c];
        }
        float* dqi = row_of(dq, p.q, b, h, i);
        for (int64_t c = 0; c < p.d; ++c) dqi[c] = static_cast<float>(gq[c]);
      }
      if (h % p.kv_group != p.kv_group - 1) continue;
      for (int64_t j = 0; j < p.tk; ++j) {
        float* dkj = row_of(dk, p.k, b, hk, j);
        float* dvj = row_of(dv, p.v, b, hk, j);
        for (int64_t c = 0; c < p.d; ++c) dkj[c] = static_cast<float>(gk[j * p.d + c]);
        for (int64_t c = 0; c < p.dv; ++c) dvj[c] = static_cast<float>(gv[j * p.dv + c]);
      }
    }
  });
}

}  // namespace loom::cpu
