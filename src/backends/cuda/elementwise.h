// CUDA kernels for element-wise arithmetic and dtype conversion: the same contracts as
// backends/cpu/elementwise.h, on device memory, queued on ctx's stream (asynchronous).
// n is the element count; buffers are contiguous. bf16 is widened to f32 for the arithmetic and
// rounded to nearest even once on store, as on the CPU.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

void add_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t n);  // out = a + b
void add_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t n);
void add_inplace(const Context& ctx, float* out, const float* b, int64_t n);                  // out += b
void mul_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t n);  // out = a * b
void scale_forward(const Context& ctx, float* out, const float* a, float s, int64_t n);       // out = a * s
// out[n] = sum over rows m of x[m, n], x: [M, N], in blocks of rows (backends/row_sums.h: the CPU's
// order, so the same bits), the bias gradient of a linear layer.
void sum_rows(const Context& ctx, const float* x, int64_t M, int64_t N, float* out);
void convert_f32_to_bf16(const Context& ctx, bf16* out, const float* in, int64_t n);
void convert_bf16_to_f32(const Context& ctx, float* out, const bf16* in, int64_t n);

}  // namespace loom::cuda
