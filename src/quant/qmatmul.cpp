// quantized_matmul: argument checks, the run-time choice of kernels, and the split over threads.
// The kernels: kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512_vnni.cpp (+ kernels_x86.inc).
#include "quant/qmatmul.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/amx.h"
#include "core/error.h"
#include "core/parallel.h"
#include "quant/kernels.h"

namespace loom::quant {

// ---- QuantizedMatrix -------------------------------------------------------------------------------

namespace {
int64_t checked_row_bytes(QuantType type, int64_t rows, int64_t cols) {
  LOOM_CHECK(rows >= 0 && cols > 0, "QuantizedMatrix: shape [", rows, ", ", cols, "] must have rows >= 0 and cols > 0");
  return row_bytes(type, cols);
}

// The interleaved layout is only read by the SIMD kernels, so a CPU without them does not pay its memory.
std::vector<uint8_t> packed_copy(QuantType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  if (detail::packed_block_bytes(type) == 0 || rows < 8 || !kernel_path_supported(KernelPath::Avx2)) return {};
  return detail::pack_rows8(type, bytes.data(), rows, cols);
}

}  // namespace

QuantizedMatrix::QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, std::vector<uint8_t> bytes)
    : type_(type), rows_(rows), cols_(cols), row_bytes_(checked_row_bytes(type, rows, cols)), bytes_(std::move(bytes)) {
  LOOM_ASSERT(static_cast<int64_t>(bytes_.size()) == rows * row_bytes_);
  packed_ = packed_copy(type_, bytes_, rows_, cols_);
}

QuantizedMatrix::QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, const void* data)
    : type_(type), rows_(rows), cols_(cols), row_bytes_(checked_row_bytes(type, rows, cols)) {
  LOOM_CHECK(data != nullptr || rows == 0, "QuantizedMatrix: no data for a [", rows, ", ", cols, "] ",
             quant_type_name(type), " matrix");
  bytes_.resize(static_cast<size_t>(rows * row_bytes_));
  if (!bytes_.empty()) std::memcpy(bytes_.data(), data, bytes_.size());
  packed_ = packed_copy(type_, bytes_, rows_, cols_);
}

QuantizedMatrix::QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, std::shared_ptr<const void> owner,
                                 const uint8_t* data)
    : type_(type), rows_(rows), cols_(cols), row_bytes_(checked_row_bytes(type, rows, cols)), owner_(std::move(owner)),
      borrowed_(data) {
  LOOM_CHECK(owner_ != nullptr && (data != nullptr || rows == 0), "QuantizedMatrix: no data for a [", rows, ", ", cols,
             "] ", quant_type_name(type), " matrix");
}

QuantizedMatrix QuantizedMatrix::quantize(QuantType type, const float* w, int64_t rows, int64_t cols) {
  const int64_t rb = checked_row_bytes(type, rows, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * rb));
  parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quant::quantize(type, w + r * cols, cols, bytes.data() + r * rb);
  });
  return QuantizedMatrix(type, rows, cols, std::move(bytes));
}

void QuantizedMatrix::dequantize(float* out) const {
  parallel_for(0, rows_, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quant::dequantize(type_, data() + r * row_bytes_, cols_, out + r * cols_);
  });
}

void QuantizedMatrix::dequantize_rows(int64_t first, int64_t count, float* out) const {
  LOOM_CHECK(first >= 0 && count >= 0 && first + count <= rows_, "dequantize_rows: rows [", first, ", ", first + count,
             ") of a matrix of ", rows_);
  parallel_for(0, count, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      quant::dequantize(type_, data() + (first + r) * row_bytes_, cols_, out + r * cols_);
    }
  });
}

namespace detail {

int64_t packed_block_bytes(QuantType type) {
  switch (type) {
    case QuantType::Q8_0: return 16 + 8 * 32;
    case QuantType::Q4_0: return 16 + 8 * 16;
    case QuantType::Q4_1: return 32 + 8 * 16;
    case QuantType::Q4_K: return 64 + 8 * 16;  // per 32-element sub-block: f32 scales and mins
    default: return 0;
  }
}

namespace {

// Q4_K's sub-block j of 32 is Q4_1-like with scale d*sc_j and offset -dmin*m_j; both products are exact
// in f32 (11-bit by 6-bit mantissas), so the group keeps them as f32 and its nibbles in Q4_0's order.
void pack_q4_k_rows8(const uint8_t* bytes, int64_t cols, int64_t g, uint8_t* out) {
  const int64_t nb = cols / 32, rb = cols / 256 * 144;
  for (int64_t sb = 0; sb < nb; ++sb) {
    uint8_t* dst = out + sb * 192;
    for (int64_t r = 0; r < 8; ++r) {
      const uint8_t* src = bytes + (8 * g + r) * rb + (sb / 8) * 144;
      const int j = static_cast<int>(sb % 8);
      uint16_t d16, dmin16;
      std::memcpy(&d16, src, 2);
      std::memcpy(&dmin16, src + 2, 2);
      uint8_t sc, m;
      q4_k_scale_min(src + 4, j, &sc, &m);
      const float d = f16_to_f32(d16) * static_cast<float>(sc), mn = f16_to_f32(dmin16) * static_cast<float>(m);
      std::memcpy(dst + 4 * r, &d, 4);
      std::memcpy(dst + 32 + 4 * r, &mn, 4);
      uint8_t e[32], packed[16];
      for (int l = 0; l < 32; ++l) e[l] = (src[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
      for (int k = 0; k < 16; ++k) packed[k] = static_cast<uint8_t>(e[k] | (e[k + 16] << 4));
      for (int c = 0; c < 4; ++c) std::memcpy(dst + 64 + 32 * c + 4 * r, packed + 4 * c, 4);
    }
  }
}

}  // namespace

std::vector<uint8_t> pack_rows8(QuantType type, const uint8_t* bytes, int64_t rows, int64_t cols) {
  const int64_t pb = packed_block_bytes(type), bb = block_bytes(type), nb = cols / 32, groups = rows / 8;
  LOOM_ASSERT(pb > 0 && cols % 32 == 0);
  const int64_t scales = type == QuantType::Q4_1 ? 2 : 1;  // f16 fields at the block's start
  const int64_t qbytes = bb - 2 * scales;                  // 32 (Q8_0) or 16 (Q4_0, Q4_1)
  std::vector<uint8_t> out(static_cast<size_t>(groups * nb * pb));
  if (type == QuantType::Q4_K) {
    parallel_for(0, groups, 64, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) pack_q4_k_rows8(bytes, cols, g, out.data() + g * nb * pb);
    });
    return out;
  }
  parallel_for(0, groups, 64, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* dst = out.data() + (g * nb + b) * pb;
        for (int64_t r = 0; r < 8; ++r) {
          const uint8_t* src = bytes + (8 * g + r) * (nb * bb) + b * bb;
          for (int64_t f = 0; f < scales; ++f) std::memcpy(dst + 16 * f + 2 * r, src + 2 * f, 2);
          for (int64_t c = 0; c < qbytes / 4; ++c) std::memcpy(dst + 16 * scales + 32 * c + 4 * r, src + 2 * scales + 4 * c, 4);
        }
      }
    }
  });
  return out;
}

}  // namespace detail

bool has_matmul_kernels(QuantType type) {
  switch (type) {
    case QuantType::Q8_0: case QuantType::Q4_0: case QuantType::Q4_1: case QuantType::Q4_K: case QuantType::Q6_K:
      return true;
    default:
      return false;
  }
}

// ---- paths ------------------------------------------------------------------------------------------

const char* kernel_path_name(KernelPath path) {
  switch (path) {
    case KernelPath::Auto: return "auto";
    case KernelPath::Scalar: return "scalar";
    case KernelPath::Avx2: return "avx2";
    case KernelPath::Avx512Vnni: return "avx512-vnni";
    case KernelPath::Amx: return "amx";
  }
  return "?";
}

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// What CPUID and the OS (XCR0: which register state it saves) allow. Read directly rather than through
// __builtin_cpu_supports, whose feature names differ between compilers (clang 14 lacks avx512vnni).
struct X86Features {
  bool avx2 = false, fma = false, f16c = false, avx512 = false, avx512_vnni = false, amx_int8 = false;
};

X86Features read_x86_features() {
  X86Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6, zmm_state = (xcr0_lo & 0xe6) == 0xe6;
  if (!ymm_state || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = (b >> 5) & 1;
  // AVX-512 F, BW and VL (EBX bits 16, 30, 31) and VNNI (ECX bit 11), with the OS saving zmm state.
  f.avx512 = zmm_state && ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  f.avx512_vnni = f.avx512 && ((c >> 11) & 1);
  // AMX-TILE and AMX-INT8 (EDX bits 24, 25), with XCR0 saying the OS manages the tile configuration and
  // data (bits 17, 18), and the process granted the data.
  const bool tile_state = ((xcr0_lo >> 17) & 3) == 3;
  f.amx_int8 = f.avx512_vnni && ((d >> 24) & 1) && ((d >> 25) & 1) && tile_state && amx_tile_state_granted();
  return f;
}

const X86Features& x86_features() {
  static const X86Features features = read_x86_features();
  return features;
}
#endif

}  // namespace

bool kernel_path_supported(KernelPath path) {
  switch (path) {
    case KernelPath::Auto: case KernelPath::Scalar: return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case KernelPath::Avx2:
      return detail::avx2_kernels() && x86_features().avx2 && x86_features().fma && x86_features().f16c;
    case KernelPath::Avx512Vnni:
      return detail::avx512_vnni_kernels() && kernel_path_supported(KernelPath::Avx2) && x86_features().avx512_vnni;
    case KernelPath::Amx:
      return detail::amx_kernels() && kernel_path_supported(KernelPath::Avx512Vnni) && x86_features().amx_int8;
#else
    case KernelPath::Avx2: case KernelPath::Avx512Vnni: case KernelPath::Amx: return false;
#endif
  }
  return false;
}

namespace {

KernelPath detect_best_path() {
  if (const char* env = std::getenv("LOOM_QUANT_KERNEL"); env && *env) {
    const std::string want = env;
    for (KernelPath p : {KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512Vnni, KernelPath::Amx}) {
      if (want == kernel_path_name(p)) {
        LOOM_CHECK(kernel_path_supported(p), "LOOM_QUANT_KERNEL=", want, ": this CPU cannot run the ", want,
                   " kernels");
        return p;
      }
    }
    LOOM_FAIL("LOOM_QUANT_KERNEL=", want, " is not a kernel path (expected scalar, avx2, avx512-vnni or amx)");
  }
  if (kernel_path_supported(KernelPath::Amx)) return KernelPath::Amx;
  if (kernel_path_supported(KernelPath::Avx512Vnni)) return KernelPath::Avx512Vnni;
  if (kernel_path_supported(KernelPath::Avx2)) return KernelPath::Avx2;
  return KernelPath::Scalar;
}

const detail::KernelTable& kernels_for(KernelPath path) {
  if (path == KernelPath::Auto) path = best_kernel_path();
  LOOM_CHECK(kernel_path_supported(path), "quantized_matmul: this CPU cannot run the ", kernel_path_name(path),
             " kernels");
  switch (path) {
    case KernelPath::Avx2: return *detail::avx2_kernels();
    case KernelPath::Avx512Vnni: return *detail::avx512_vnni_kernels();
    case KernelPath::Amx: return *detail::amx_kernels();
    default: return detail::scalar_kernels();
  }
}

// Int8x2's kernel for a weight type (nullptr for Q6_K: two rows through its one-level kernel).
detail::TileKernel levels_tile_for(const detail::KernelTable& k, QuantType type) {
  switch (type) {
    case QuantType::Q8_0: return k.q8_0_x2;
    case QuantType::Q4_0: return k.q4_0_x2;
    case QuantType::Q4_1: return k.q4_1_x2;
    case QuantType::Q4_K: return k.q4_k_x2;
    default: return nullptr;
  }
}

detail::TileKernel tile_for(const detail::KernelTable& k, QuantType type) {
  switch (type) {
    case QuantType::Q8_0: return k.q8_0;
    case QuantType::Q4_0: return k.q4_0;
    case QuantType::Q4_1: return k.q4_1;
    case QuantType::Q4_K: return k.q4_k;
    case QuantType::Q6_K: return k.q6_k;
    default: break;
  }
  LOOM_FAIL("quantized_matmul: no kernels for ", quant_type_name(type),
            " weights (Q8_0, Q4_0, Q4_1, Q4_K and Q6_K have them; dequantize the others to f32)");
}

void check_activations(int64_t M, int64_t K) {
  LOOM_CHECK(M >= 0, "quantize_activations: M = ", M, " must be >= 0");
  LOOM_CHECK(K > 0 && K % 32 == 0, "quantize_activations: K = ", K,
             " must be a positive multiple of 32 (activations are quantized in blocks of 32)");
}

}  // namespace

KernelPath best_kernel_path() {
  static const KernelPath best = detect_best_path();
  return best;
}

// ---- activation rounding ----------------------------------------------------------------------------

const char* activation_rounding_name(ActivationRounding r) {
  if (r == ActivationRounding::Default) r = default_activation_rounding();
  return r == ActivationRounding::Int8 ? "int8" : "int8x2";
}

ActivationRounding activation_rounding_from_name(const std::string& name, const std::string& where) {
  if (name == "int8") return ActivationRounding::Int8;
  if (name == "int8x2") return ActivationRounding::Int8x2;
  LOOM_FAIL(where, " = '", name.substr(0, 40), name.size() > 40 ? "...'" : "'",
            " is not an activation rounding (expected int8 or int8x2)");
}

namespace {
// 0: not set yet (the environment decides on first use).
std::atomic<int> g_default_rounding{0};

ActivationRounding rounding_from_environment() {
  const char* env = std::getenv("LOOM_QUANT_ACTIVATIONS");
  if (env == nullptr || *env == '\0') return ActivationRounding::Int8x2;
  return activation_rounding_from_name(env, "LOOM_QUANT_ACTIVATIONS");
}
}  // namespace

ActivationRounding default_activation_rounding() {
  int v = g_default_rounding.load(std::memory_order_relaxed);
  if (v == 0) {
    v = static_cast<int>(rounding_from_environment());
    int expected = 0;
    if (!g_default_rounding.compare_exchange_strong(expected, v)) v = expected;
  }
  return static_cast<ActivationRounding>(v);
}

void set_default_activation_rounding(ActivationRounding r) {
  LOOM_CHECK(r != ActivationRounding::Default, "set_default_activation_rounding: give int8 or int8x2");
  g_default_rounding.store(static_cast<int>(r));
}

int64_t activation_levels(ActivationRounding r) {
  if (r == ActivationRounding::Default) r = default_activation_rounding();
  return r == ActivationRounding::Int8x2 ? 2 : 1;
}

namespace {

// One row of x [K] into L rows of blocks, out[l * nb + b]: level 0 rounds x, level 1 (Int8x2) the
// residual x - d q at the fixed scale d / 256 (qmatmul.h).
void quantize_row_levels(const detail::KernelTable& kernels, const float* x, int64_t K, int64_t levels, ActBlock* out) {
  kernels.quantize_row(x, K, out);
  if (levels == 2) kernels.quantize_residual(x, K, out, out + K / 32);
}

// y[m * ldy + n] for n in [n0, n1) from the levels' rows of a [M * L, nb]. With one level, or with
// Int8x2's kernels (the two levels' integer dots combined before the f32 work), the kernel writes y
// itself. Q6_K's two levels go through its one-level kernel as two rows into a small scratch, and y is
// their sum, level 0 + level 1, the same order for every path, thread count and batch.
void tile_levels(const detail::KernelTable& kernels, const QuantizedMatrix& w, const uint8_t* packed,
                 const ActBlock* a, const int8_t* tiles, int64_t M, int64_t levels, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  const detail::TileKernel tile = tile_for(kernels, w.type());
  const int64_t nb = w.cols() / 32;
  if (levels == 1) {
    tile(w.data(), w.row_bytes(), packed, a, tiles, M, nb, n0, n1, y, ldy);
    return;
  }
  if (const detail::TileKernel both = levels_tile_for(kernels, w.type()); both != nullptr) {
    both(w.data(), w.row_bytes(), packed, a, tiles, M, nb, n0, n1, y, ldy);
    return;
  }
  const int64_t pb = detail::packed_block_bytes(w.type());
  constexpr int64_t kSlice = 64;  // rows of W per pass: a multiple of 16, the tiles' block of rows
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(M * levels * kSlice));
  for (int64_t s0 = n0; s0 < n1; s0 += kSlice) {
    const int64_t width = std::min(kSlice, n1 - s0);
    // The slice as a matrix of its own (s0 is a multiple of 8, so its interleaved groups start there).
    const uint8_t* slice_packed = packed != nullptr ? packed + (s0 / 8) * nb * pb : nullptr;
    tile(w.data() + s0 * w.row_bytes(), w.row_bytes(), slice_packed, a, tiles, M * levels, nb, 0, width, scratch.data(), kSlice);
    for (int64_t m = 0; m < M; ++m) {
      const float* lo = scratch.data() + (m * levels) * kSlice;
      const float* hi = lo + kSlice;
      float* out = y + m * ldy + s0;
      for (int64_t j = 0; j < width; ++j) out[j] = lo[j] + hi[j];
    }
  }
}

}  // namespace

// ---- entry points ------------------------------------------------------------------------------------

void quantize_activations(const float* x, int64_t M, int64_t K, ActBlock* out, KernelPath path,
                          ActivationRounding rounding) {
  check_activations(M, K);
  const detail::KernelTable& kernels = kernels_for(path);
  const int64_t levels = activation_levels(rounding);
  parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize_row_levels(kernels, x + m * K, K, levels, out + m * levels * (K / 32));
  });
}

void quantized_matmul(const float* x, int64_t M, const QuantizedMatrix& w, float* y, KernelPath path,
                      ActivationRounding rounding) {
  const int64_t N = w.rows(), K = w.cols();
  LOOM_CHECK(K % 32 == 0, "quantized_matmul: K = ", K, " is not a multiple of 32");
  const detail::KernelTable& kernels = kernels_for(path);
  tile_for(kernels, w.type());  // refuses a type without kernels
  if (M == 0 || N == 0) return;
  const int64_t nb = K / 32, levels = activation_levels(rounding);
  std::vector<ActBlock> a(static_cast<size_t>(M * levels * nb));
  parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize_row_levels(kernels, x + m * K, K, levels, a.data() + m * levels * nb);
  });
  // Each output is computed whole by one chunk, so splitting N evenly over the threads (the grain
  // depends on the thread count) changes no result. Chunks are multiples of 16 rows (the tile's block).
  const int64_t threads = num_threads(), per_thread = (N + threads - 1) / threads;
  const int64_t grain = (per_thread + 15) / 16 * 16;
  const uint8_t* packed = &kernels == &detail::scalar_kernels() ? nullptr : w.packed();
  // The AMX kernels' copy (pack_activation_tiles) once for every chunk of W, where they run.
  std::vector<int8_t> tiles;
  if (&kernels == detail::amx_kernels() && M * levels >= 16) {
    tiles.assign(static_cast<size_t>(activation_tile_bytes(M * levels, K)), 0);
    pack_activation_tiles(a.data(), 0, M * levels, K, tiles.data());
  }
  const int8_t* t = tiles.empty() ? nullptr : tiles.data();
  parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { tile_levels(kernels, w, packed, a.data(), t, M, levels, n0, n1, y, N); });
}

void quantize_activation_rows(const float* x, int64_t M, int64_t K, ActBlock* out, KernelPath path,
                              ActivationRounding rounding) {
  LOOM_ASSERT(K % 32 == 0);
  const detail::KernelTable& kernels = kernels_for(path);
  const int64_t levels = activation_levels(rounding);
  for (int64_t m = 0; m < M; ++m) quantize_row_levels(kernels, x + m * K, K, levels, out + m * levels * (K / 32));
}

void quantized_matmul_rows(const ActBlock* a, int64_t M, const QuantizedMatrix& w, int64_t n0, int64_t n1, float* y,
                           int64_t ldy, KernelPath path, ActivationRounding rounding, const int8_t* tiles) {
  LOOM_ASSERT(n0 % 8 == 0 && 0 <= n0 && n0 <= n1 && n1 <= w.rows() && w.cols() % 32 == 0);
  if (n0 == n1 || M == 0) return;
  const detail::KernelTable& kernels = kernels_for(path);
  const uint8_t* packed = &kernels == &detail::scalar_kernels() ? nullptr : w.packed();
  tile_levels(kernels, w, packed, a, tiles, M, activation_levels(rounding), n0, n1, y, ldy);
}

int64_t activation_tile_bytes(int64_t rows, int64_t K) { return (rows + 15) / 16 * 16 * K; }

void pack_activation_tiles(const ActBlock* a, int64_t row0, int64_t row1, int64_t K, int8_t* tiles) {
  const int64_t nb = K / 32;
  for (int64_t r = row0; r < row1; ++r) {
    int8_t* out = tiles + ((r / 16) * nb * 16 + r % 16) * 32;
    for (int64_t b = 0; b < nb; ++b) std::memcpy(out + b * 16 * 32, a[r * nb + b].q, 32);
  }
}

void prefetch_matmul_rows(const QuantizedMatrix& w, int64_t n0, int64_t n1, int64_t bytes) {
  if (n0 >= n1) return;
  const uint8_t* begin;
  int64_t size;
  if (const int64_t pb = detail::packed_block_bytes(w.type()); w.packed() != nullptr && pb > 0 && n0 + 8 <= n1) {
    begin = w.packed() + (n0 / 8) * (w.cols() / 32) * pb;  // the 8-row groups from n0 on, back to back
    size = (n1 - n0) / 8 * (w.cols() / 32) * pb;
  } else {
    begin = w.data() + n0 * w.row_bytes();
    size = (n1 - n0) * w.row_bytes();
  }
  size = std::min(size, bytes);
  for (int64_t off = 0; off < size; off += 64) __builtin_prefetch(begin + off, 0, 3);
}

void quantized_matmul_reference(const float* x, int64_t M, const QuantizedMatrix& w, float* y,
                                ActivationRounding rounding) {
  const int64_t N = w.rows(), K = w.cols();
  check_activations(M, K);
  tile_for(detail::scalar_kernels(), w.type());  // same refusal as quantized_matmul
  const int64_t nb = K / 32, levels = activation_levels(rounding);
  std::vector<ActBlock> a(static_cast<size_t>(M * levels * nb));
  for (int64_t m = 0; m < M; ++m) {
    quantize_row_levels(detail::scalar_kernels(), x + m * K, K, levels, a.data() + m * levels * nb);
  }
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    dequantize(w.type(), w.data() + n * w.row_bytes(), K, row.data());
    for (int64_t m = 0; m < M; ++m) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double xq = 0.0;  // the activation as the levels round it
        for (int64_t l = 0; l < levels; ++l) {
          const ActBlock& blk = a[static_cast<size_t>((m * levels + l) * nb + k / 32)];
          xq += static_cast<double>(blk.d) * blk.q[k % 32];
        }
        sum += static_cast<double>(row[k]) * xq;
      }
      y[m * N + n] = static_cast<float>(sum);
    }
  }
}

}  // namespace loom::quant
