// The per-instruction-set kernel tables behind quantized_matmul (qmatmul.cpp picks one at run time).
// Internal to src/quant.
//
// A tile kernel computes, for weight rows n in [n0, n1) and activation rows m in [0, M):
//   y[m * ldy + n] = sum over the row's blocks of dot(weight block, activation block)
// w points at row 0 of W (rows of row_bytes bytes); a is [M, nb] activation blocks, nb = K / 32.
// packed (or nullptr) is the same matrix in the 8-row interleaved layout of pack_rows8; n0 is then a
// multiple of 8, and the SIMD kernels use it for every complete group of 8 rows.
//
// The 8-row interleaved layout (Q8_0, Q4_0, Q4_1, Q4_K; what the AVX2 / VNNI kernels read): rows in groups
// of 8, each group's blocks one after another, a block of the group being
//   [8 f16 d][8 f16 m, Q4_1 only][quant bytes as 32-byte chunks]
// where 4-byte lane r of chunk c holds row r's quant bytes 4c..4c+3 (Q4: chunk c's low nibbles are
// elements 4c..4c+3, its high nibbles 4c+16..4c+19). One vector instruction then multiplies 4 weights of
// each of 8 rows by the same 4 broadcast activations, and the 8 rows' dot products land in the 8 lanes
// of one accumulator: no horizontal sums, one scale FMA per 8 rows. (llama.cpp repacks Q4_0 to a
// similar interleaved layout for the same reason.) Q4_K is packed per 32-element sub-block as
//   [8 f32 d*sc][8 f32 dmin*m][the sub-block's nibbles in Q4_0's order, chunked as above]
// (x = d*sc*q - dmin*m: Q4_1 with f32 scales and a negated offset).
#pragma once

#include <cstdint>
#include <vector>

#include "quant/qmatmul.h"

namespace loom::quant::detail {

// tiles (or nullptr): the same activation rows in pack_activation_tiles' layout (qmatmul.h), which the
// AMX kernels read their activation tiles from; the other kernels ignore it.
using TileKernel = void (*)(const uint8_t* w, int64_t row_bytes, const uint8_t* packed, const ActBlock* a,
                            const int8_t* tiles, int64_t M, int64_t nb, int64_t n0, int64_t n1, float* y, int64_t ldy);
using QuantizeRow = void (*)(const float* x, int64_t K, ActBlock* out);
// Int8x2's level 1 of a row (qmatmul.h) from the row x [K] and its level-0 blocks: out [K / 32].
using QuantizeResidual = void (*)(const float* x, int64_t K, const ActBlock* level0, ActBlock* out);

struct KernelTable {
  QuantizeRow quantize_row;
  QuantizeResidual quantize_residual;
  TileKernel q8_0, q4_0, q4_1, q4_k, q6_k;
  // Int8x2's tile kernels: a is [2M, nb], token m's levels rows 2m and 2m + 1, and y[m * ldy + n] is the
  // token's product, each block's two integer dots combined in int32 (256 dot0 + dot1) and scaled once
  // by level 1's d and s (qmatmul.h). Q6_K has none (its sub-block scales would overflow the int32):
  // its two levels go through q6_k as two rows, summed in f32 (qmatmul.cpp, tile_levels).
  TileKernel q8_0_x2, q4_0_x2, q4_1_x2, q4_k_x2;
};

// Bytes of one block of a group of 8 rows in the interleaved layout; 0 for types without it.
int64_t packed_block_bytes(QuantType type);
// The interleaved copy of the first rows - rows % 8 rows of a [rows, cols] matrix in GGUF bytes.
std::vector<uint8_t> pack_rows8(QuantType type, const uint8_t* bytes, int64_t rows, int64_t cols);

const KernelTable& scalar_kernels();
// nullptr when the build has no such kernels (a non-x86 compiler).
const KernelTable* avx2_kernels();
const KernelTable* avx512_vnni_kernels();
// avx512_vnni_kernels' table whose 16-row pair groups take AMX int8 tiles from 8 or 16 activation rows
// on (kernels_amx.cpp); bitwise the same outputs, Int8x2's included.
const KernelTable* amx_kernels();

}  // namespace loom::quant::detail
