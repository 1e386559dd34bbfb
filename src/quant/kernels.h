// The per-instruction-set kernel tables behind quantized_matmul (qmatmul.cpp picks one at run time).
// Internal to src/quant.
//
// A tile kernel computes, for weight rows n in [n0, n1) and activation rows m in [0, M):
//   y[m * ldy + n] = sum over the row's blocks of dot(weight block, activation block)
// w points at row 0 of W (rows of row_bytes bytes); a is [M, nb] activation blocks, nb = K / 32.
#pragma once

#include <cstdint>

#include "quant/qmatmul.h"

namespace loom::quant::detail {

using TileKernel = void (*)(const uint8_t* w, int64_t row_bytes, const ActBlock* a, int64_t M, int64_t nb,
                            int64_t n0, int64_t n1, float* y, int64_t ldy);
using QuantizeRow = void (*)(const float* x, int64_t K, ActBlock* out);

struct KernelTable {
  QuantizeRow quantize_row;
  TileKernel q8_0, q4_0, q4_1, q4_k, q6_k;
};

const KernelTable& scalar_kernels();
// nullptr when the build has no such kernels (a non-x86 compiler).
const KernelTable* avx2_kernels();
const KernelTable* avx512_vnni_kernels();

}  // namespace loom::quant::detail
