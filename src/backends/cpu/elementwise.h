// CPU kernels for element-wise arithmetic. n is the element count; buffers are contiguous.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom::cpu {

void add_forward(float* out, const float* a, const float* b, int64_t n);       // out = a + b
void add_inplace(float* out, const float* b, int64_t n);                       // out += b
void mul_forward(float* out, const float* a, const float* b, int64_t n);       // out = a * b
void scale_forward(float* out, const float* a, float s, int64_t n);            // out = a * s
void axpby(float* out, float alpha, const float* a, float beta, const float* b, int64_t n);  // out = alpha*a + beta*b
double sum(const float* a, int64_t n);                                         // fixed-order sum
// f32 -> bf16, rounding to nearest even (the AVX512-BF16 instruction where the CPU has it).
void convert_f32_to_bf16(const float* in, bf16* out, int64_t n);

}  // namespace loom::cpu
