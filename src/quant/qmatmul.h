// Quantized matrix multiplication for inference: y = x W^T with W kept in its GGUF block format.
//
// Legend: M rows of x (tokens), K the reduction (in features), N rows of W (out features).
//
//   x: [M, K] f32   W: [N, K] quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)   y: [M, N] f32
//
// How (as llama.cpp does): each row of x is first quantized to 8 bits per block of 32 (ActBlock), then
// every (weight block, activation block) pair is an integer dot product (AVX2 vpmaddubsw + vpmaddwd,
// or AVX-512 VNNI vpdpbusd) scaled by the two blocks' float scales. Weights stay quantized (the file's
// bytes, plus an 8-row interleaved copy the SIMD kernels read: kernels.h): decoding reads each weight
// byte once per token, which is what makes 4-bit weights 4-6x faster than f32 (docs/quant.md).
//
// Activation rounding (the only approximation against the dequantized-f32 product): per block of 32,
// d = max|x| / 127 and q = round-to-nearest-even(x * (1/d)) in [-127, 127], d kept in f32 (ggml keeps
// it in f16). Each x is then off by at most d/2 (plus one f32 rounding), so
//   |y[m,n] - sum_k x[m,k] W[n,k]| <= sum over blocks b of (d_b / 2) * sum_{k in b} |W[n,k]|
// up to f32 accumulation error; tests/quant/qmatmul_test.cpp checks exactly this bound.
//
// That is ActivationRounding::Int8, llama.cpp's choice. ActivationRounding::Int8x2 (loom's default, see
// docs/quant.md for the measurement behind it) rounds each block twice: level 0 as above, then level 1
// rounds the residual r = x - d q (one fused multiply-add) at the fixed step d' = d / 256:
//   q' = round-to-nearest-even(clamp(r * (256 / d), -127, 127)),   x ~ d q + d' q' = d' (256 q + q').
// Since |r| <= d/2, each x is off by at most d/512, or by d/256 where |r| > 127.5 d' and q' clamps
// (to +-127, not -128, which the Q8_0 kernels' sign trick cannot negate): about 16-bit activations, and
// the bound above holds with those per-element bounds for d_b / 2 (tests/quant checks both, the
// per-element one tightly). The two levels share a scale, so a block's two integer dots combine exactly
// in int32, 256 dot(w, q) + dot(w, q') (the largest, Q8_0's: 32 * 128 * 127 * 257 < 2^31), and are
// scaled once: level 1's ActBlock carries the token's d' and s' = d' sum(256 q + q'), and each kernel
// runs its one-level f32 operations on (combined dot, d', s'): half the f32 work of two rows, and no
// sum of levels. The integer work is two rows' (one unpack of a weight block serves both). Q6_K, whose
// int8 sub-block scales would take the combined dot past int32, takes the levels as two rows of its
// one-level kernel, summed in f32 (level 0 + level 1).
//
// Paths: Scalar (portable C++, the test oracle), Avx2, Avx512Vnni (AVX-512 VL + VNNI), Amx (the
// Avx512Vnni kernels, with AMX int8 tiles for the integer dots of many activation rows), chosen at run
// time by CPUID (Auto). Every path computes the same integer sums and differs from the others only in
// the order of the f32 accumulation; Amx is bitwise Avx512Vnni (the same f32 operations on the same
// integers). Results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quant/quant.h"

namespace loom::quant {

// W: [rows, cols] in a GGUF block type, each row row_bytes(type, cols) bytes, rows contiguous.
class QuantizedMatrix {
 public:
  // Copies rows * row_bytes(type, cols) bytes of `data` (the tensor's bytes as stored in a GGUF file).
  QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, const void* data);
  // Reads rows * row_bytes(type, cols) bytes at `data` in place, kept alive by `owner` (a GGUF file's
  // mapping: gguf::GgufFile::owner), with no interleaved copy: the file's pages are the only copy of the
  // matrix (a QLoRA base; clean pages the kernel may drop and read again under memory pressure). The
  // integer kernels then read the rows as stored: the same integer sums, summed in another order, slower.
  QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, std::shared_ptr<const void> owner, const uint8_t* data);
  // Quantizes an f32 [rows, cols] matrix with the reference quantizer (type: Q8_0, Q4_0 or Q4_1).
  static QuantizedMatrix quantize(QuantType type, const float* w, int64_t rows, int64_t cols);

  QuantType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t row_bytes() const { return row_bytes_; }
  const uint8_t* data() const { return owner_ ? borrowed_ : bytes_.data(); }
  int64_t nbytes() const { return rows_ * row_bytes_; }
  // The reference dequantization, [rows, cols] into out.
  void dequantize(float* out) const;
  // Rows [first, first + count) of it, [count, cols] into out.
  void dequantize_rows(int64_t first, int64_t count, float* out) const;

  // It holds the same bytes rearranged, so a matrix with it takes about twice the memory.
  const uint8_t* packed() const { return packed_.empty() ? nullptr : packed_.data(); }

 private:
  QuantizedMatrix(QuantType type, int64_t rows, int64_t cols, std::vector<uint8_t> bytes);
  QuantType type_;
  int64_t rows_, cols_, row_bytes_;
  std::vector<uint8_t> bytes_, packed_;
  std::shared_ptr<const void> owner_;  // set: the bytes are borrowed_, not bytes_
  const uint8_t* borrowed_ = nullptr;
};

// Whether quantized_matmul has kernels for this weight type (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K).
bool has_matmul_kernels(QuantType type);

enum class KernelPath { Auto, Scalar, Avx2, Avx512Vnni, Amx };
const char* kernel_path_name(KernelPath path);  // "scalar", "avx2", "avx512-vnni", "amx"
// Whether this CPU (CPUID) can run a path; Auto and Scalar always can. Amx also needs the OS to grant
// the process the tile state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, asked once here).
bool kernel_path_supported(KernelPath path);
// What Auto resolves to: the widest supported path, unless LOOM_QUANT_KERNEL (scalar, avx2,
// avx512-vnni, amx) asks for another, which is refused by name if this CPU cannot run it
// (LOOM_QUANT_KERNEL=avx512-vnni keeps an AMX machine off the tiles).
KernelPath best_kernel_path();

// How finely activations are rounded (the comment at the top): one 8-bit level, or the value and its
// residual at 8 bits each (the residual at 1/256 of the value's step). Default: what default_activation_rounding() says.
enum class ActivationRounding { Default, Int8, Int8x2 };
const char* activation_rounding_name(ActivationRounding r);  // "int8", "int8x2" (Default: the resolved one)
// Int8 or Int8x2 from a name, refused by name otherwise ("where" names the setting in the message).
ActivationRounding activation_rounding_from_name(const std::string& name, const std::string& where);
// The process's default: Int8x2 unless LOOM_QUANT_ACTIVATIONS (int8, int8x2) or
// set_default_activation_rounding (`--activations` of the commands that run quantized weights) says otherwise.
ActivationRounding default_activation_rounding();
void set_default_activation_rounding(ActivationRounding r);
// Activation rows per input row: 1 (Int8) or 2 (Int8x2); Default resolved.
int64_t activation_levels(ActivationRounding r = ActivationRounding::Default);

// One 32-element block of an activation row quantized to 8 bits: x ~ d * q.
// Int8x2's level 1 (the comment at the top) is a block of q' with d = d' = level 0's d / 256 and s the
// token's, d' * (sum of 256 q + q'); its sum16 are its own.
struct ActBlock {
  float d;           // max|x| / 127 (0 for an all-zero block, NaN if the block holds inf or NaN)
  float s;           // d * (sum of q), for the formats whose weights have an offset (Q4_1, Q4_K, Q4_0)
  int8_t q[32];
  int16_t sum16[2];  // sums of q over elements 0..15 and 16..31 (Q6_K's 16-element sub-blocks)
  int32_t q8_bias;   // what the AVX-512 Q8_0 pair kernels take off their dots (kernels_x86.inc, pair_bias):
                     // 128 sum(q); on Int8x2's level 1, 256 times level 0's plus its own 128 sum(q')
};
static_assert(sizeof(ActBlock) == 48);

// Quantizes x [M, K] (K a multiple of 32) into out [M * L, K/32] with the rounding stated above, L =
// activation_levels(rounding): row m's level l is activation row m * L + l.
void quantize_activations(const float* x, int64_t M, int64_t K, ActBlock* out, KernelPath path = KernelPath::Auto,
                          ActivationRounding rounding = ActivationRounding::Default);

// y [M, N] = x [M, K] @ W^T, W: [N, K]. Refuses mismatched K and weight types without kernels, by name.
void quantized_matmul(const float* x, int64_t M, const QuantizedMatrix& w, float* y,
                      KernelPath path = KernelPath::Auto, ActivationRounding rounding = ActivationRounding::Default);

// One thread's part of quantized_matmul, for callers that run their own team of threads (the fused
// decode step: backends/cpu/decode_step.h). Both run on the calling thread only.
//   quantize_activation_rows: quantize_activations without the thread split (the same bytes).
//   quantized_matmul_rows: y[m * ldy + n] for n in [n0, n1) and m in [0, M) from activations a [M * L, K/32]
//     already quantized with the same rounding; n0 must be a multiple of 8 (the interleaved row groups).
//     Every output is bit for bit quantized_matmul's with the same path and rounding.
// Neither checks its arguments beyond assertions: check the matrix (has_matmul_kernels, K) before, and
// resolve the rounding (activation_levels) before a team of threads that cannot throw.
void quantize_activation_rows(const float* x, int64_t M, int64_t K, ActBlock* out, KernelPath path = KernelPath::Auto,
                              ActivationRounding rounding = ActivationRounding::Default);
//   tiles (or nullptr): the same rows copied by pack_activation_tiles, for the AMX kernels (below).
void quantized_matmul_rows(const ActBlock* a, int64_t M, const QuantizedMatrix& w, int64_t n0, int64_t n1, float* y,
                           int64_t ldy, KernelPath path = KernelPath::Auto,
                           ActivationRounding rounding = ActivationRounding::Default, const int8_t* tiles = nullptr);

// The AMX kernels' copy of the quant bytes of activation rows (a token's levels count as rows): each
// 16 rows' bytes block by block, [ceil(rows / 16)][K / 32][16][32] int8, so that an activation tile (16
// rows of one block) is 512 contiguous bytes on whole cache lines. Read in place from the ActBlocks
// instead (rows a row of blocks apart, half of them across a cache line) the tile loads stalled: a
// 16-token int8x2 matmul took ~7% longer (bench/qmatmul.cpp, BM_TeamMatmul). A caller that runs many
// quantized_matmul_rows over the same rows packs them once; a row's copy is independent of the
// others', so the threads that quantize the rows can copy them too. The rows of the last group past
// `rows` are never read by what the kernels keep (their products are thrown away).
int64_t activation_tile_bytes(int64_t rows, int64_t K);
// Activation rows [row0, row1) of a [*, K / 32] into tiles.
void pack_activation_tiles(const ActBlock* a, int64_t row0, int64_t row1, int64_t K, int8_t* tiles);
// Asks the CPU to start loading the first `bytes` of what quantized_matmul_rows(..., n0, n1, ...) will
// read (a thread about to wait for its team calls it for its next share: the wait then overlaps the
// first DRAM misses, which the kernels' own prefetching, running ahead of the loads, does not cover).
void prefetch_matmul_rows(const QuantizedMatrix& w, int64_t n0, int64_t n1, int64_t bytes);

// The oracle: the same activation quantization, then sum over k of dequantized W[n,k] * (sum over the
// levels of d_b * q[k]) in double. Single-threaded and slow; what every path is tested against.
void quantized_matmul_reference(const float* x, int64_t M, const QuantizedMatrix& w, float* y,
                                ActivationRounding rounding = ActivationRounding::Default);

}  // namespace loom::quant
