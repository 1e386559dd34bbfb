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
// f32 -> bf16, rounding to nearest even, on the best instruction set the CPU has (chosen at run time;
// see elementwise.cpp: AVX512-BF16 flushes denormal inputs to zero, AVX2 and scalar keep them).
void convert_f32_to_bf16(const float* in, bf16* out, int64_t n);
// The same on the calling thread only: for kernels that convert a block they have just written (AdamW's
// bf16 weight copies) inside their own parallel region.
void convert_f32_to_bf16_serial(const float* in, bf16* out, int64_t n);

// Calls of convert_f32_to_bf16 (separate passes over memory; the serial blocks fused into other kernels
// are not counted) and the elements they converted, since the process started: how tests and docs count
// the f32 -> bf16 conversions of a mixed-precision step.
struct ConvertStats {
  int64_t passes = 0;
  int64_t elements = 0;
};
ConvertStats convert_stats();

// The versions behind convert_f32_to_bf16, for tests and benchmarks. Scalar is bf16::from_float.
enum class ConvertIsa { Scalar, Avx2, Avx512Bf16 };
bool convert_isa_available(ConvertIsa isa);
const char* convert_isa_name(ConvertIsa isa);
ConvertIsa active_convert_isa();  // the one convert_f32_to_bf16 uses on this CPU
// Runs one version (serially); an error when the CPU lacks it.
void convert_f32_to_bf16_with(ConvertIsa isa, const float* in, bf16* out, int64_t n);

}  // namespace loom::cpu
