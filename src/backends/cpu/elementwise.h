// CPU kernels for element-wise arithmetic. n is the element count; buffers are contiguous.
#pragma once

#include <cstdint>

namespace loom::cpu {

void add_forward(float* out, const float* a, const float* b, int64_t n);       // out = a + b
void add_inplace(float* out, const float* b, int64_t n);                       // out += b
void mul_forward(float* out, const float* a, const float* b, int64_t n);       // out = a * b
void scale_forward(float* out, const float* a, float s, int64_t n);            // out = a * s
void axpby(float* out, float alpha, const float* a, float beta, const float* b, int64_t n);  // out = alpha*a + beta*b
double sum(const float* a, int64_t n);                                         // fixed-order sum

}  // namespace loom::cpu
