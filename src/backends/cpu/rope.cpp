#include "backends/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"

namespace loom::cpu {

void rope_tables(float* cos, float* sin, const int32_t* positions, int64_t num_positions, int64_t d,
                 float theta) {
  const int64_t half = d / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(d));
  for (int64_t p = 0; p < num_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[p]) * inv_freq[i];
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope_apply(float* out, const float* x, const float* cos, const float* sin, int64_t rows, int64_t t,
                int64_t d, bool per_row_positions, bool interleaved, bool inverse) {
  if (rows == 0 || d == 0) return;
  const int64_t half = d / 2;
  const int64_t grain = std::max<int64_t>(1, 16384 / d);
  parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t p = per_row_positions ? r : r % t;
      rope_rotate_row(out + r * d, x + r * d, cos + p * half, sin + p * half, d, interleaved, inverse);
    }
  });
}

}  // namespace loom::cpu
