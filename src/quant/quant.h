// Block-quantized weight formats of GGUF/ggml (the bit layouts are those of the GGUF specification),
// their reference (de)quantizers, and the SIMD kernels that multiply quantized weights with activations.
//
// Legend: a row of n weights is stored as n / block_elements(type) blocks of block_bytes(type) bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::quant {

// Values are GGUF's ggml_type ids, so a file's type field maps directly.
enum class QuantType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30,
};

// Refuses an id loom does not know, naming it. Known ids that loom cannot decode (Q2_K, IQ*, ...) are
// refused by name.
QuantType quant_type_from_id(uint32_t id);
const char* quant_type_name(QuantType type);  // "Q4_1", ...
int64_t block_elements(QuantType type);       // 1 for F32/F16/BF16, 32 for Q4_0..Q8_0, 256 for K-quants
int64_t block_bytes(QuantType type);
// Bytes of a row of n elements; refuses n not a multiple of block_elements(type), naming both.
int64_t row_bytes(QuantType type, int64_t n);

// Reference dequantizer: n elements (a multiple of the block size) from `data` into out.
void dequantize(QuantType type, const void* data, int64_t n, float* out);
// Quantizers used by export (F32, F16, BF16, Q8_0, Q4_0, Q4_1 at least), rounding as ggml's reference
// quantizers do; out holds row_bytes(type, n) bytes.
void quantize(QuantType type, const float* x, int64_t n, void* out);

// IEEE half precision <-> f32 (the scales of the block formats, and F16 tensors). f32_to_f16 rounds to
// nearest even and overflows to inf, as F16C's vcvtps2ph and numpy's astype(float16) do.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// The j-th (6-bit scale, 6-bit min) pair of a Q4_K super-block's 12 packed scale bytes, j in [0, 8).
void q4_k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m);

}  // namespace loom::quant
