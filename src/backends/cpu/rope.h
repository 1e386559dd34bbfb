// CPU kernels for rotary position embedding (RoPE).
//
// Legend: T sequence, D head dimension (even), P number of position entries, "rows" = all leading
// dimensions of x flattened with T (x viewed as [rows, D]).
//
// Angles come from a table: cos/sin [P, D/2], entry (p, i) = cos/sin(positions[p] * theta^(-2i/D)),
// computed in double and rounded once to float (closer to the exact rotation than PyTorch's float32
// formula; the two agree to ~1e-6 for positions below a few thousand).
//
// Pairing conventions (`interleaved`):
//   true : pairs (x[2i], x[2i+1])   (RoFormer, CS336)
//   false: pairs (x[i], x[i + D/2]) (Hugging Face Llama's rotate_half)
#pragma once

#include <cstdint>

namespace loom::cpu {

// cos, sin: [P, D/2] for positions[0..P).
void rope_tables(float* cos, float* sin, const int32_t* positions, int64_t num_positions, int64_t d,
                 float theta);

// Rotates one row of D values by the table row (cos, sin: D/2 entries); `inverse` rotates by the
// negative angle (RoPE's backward). out may equal x.
inline void rope_rotate_row(float* out, const float* x, const float* cos, const float* sin, int64_t d,
                            bool interleaved, bool inverse) {
  const int64_t half = d / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = x[2 * i], x1 = x[2 * i + 1], c = cos[i], s = sign * sin[i];
      out[2 * i] = x0 * c - x1 * s;
      out[2 * i + 1] = x0 * s + x1 * c;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = x[i], x1 = x[i + half], c = cos[i], s = sign * sin[i];
      out[i] = x0 * c - x1 * s;
      out[i + half] = x0 * s + x1 * c;
    }
  }
}

// out, x: [rows, D]. Row r uses table row (per_row_positions ? r : r % t).
void rope_apply(float* out, const float* x, const float* cos, const float* sin, int64_t rows, int64_t t,
                int64_t d, bool per_row_positions, bool interleaved, bool inverse);

}  // namespace loom::cpu
