// RoPE kernel (rope.h): one thread per rotated pair. Each pair's arithmetic is the CPU's
// rope_rotate_row line for line (x0*c - x1*s, x0*s + x1*c, with s negated for the inverse), so with the
// same tables the outputs match the CPU's up to the compiler's FMA contraction.
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/rope.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(float* out, const float* x, const float* cos, const float* sin, int64_t rows,
                            int64_t heads, int64_t t, int64_t d, bool per_row, bool interleaved, float sign) {
  const int64_t half = d / 2;
  const int64_t pairs = rows * heads * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < pairs; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, vec = k / half;  // pair i of head vector `vec`
    const int64_t r = vec / heads;               // its row (position)
    const int64_t p = per_row ? r : r % t;
    const float c = cos[p * half + i], s = sign * sin[p * half + i];
    const int64_t a = vec * d + (interleaved ? 2 * i : i);
    const int64_t b = interleaved ? a + 1 : a + half;
    const float x0 = x[a], x1 = x[b];
    // __fmul_rn/__fadd_rn: no FMA contraction, so the rounding is the CPU's (two products, one sum).
    out[a] = __fadd_rn(__fmul_rn(x0, c), -__fmul_rn(x1, s));
    out[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

}  // namespace

void rope_apply(const Context& ctx, float* out, const float* x, const float* cos, const float* sin, int64_t rows,
                int64_t t, int64_t d, bool per_row_positions, bool interleaved, bool inverse, int64_t heads) {
  const char* op = inverse ? "rope backward" : "rope";
  if (rows == 0 || d == 0 || heads == 0) return;
  LOOM_CHECK(d % 2 == 0, op, ": head dimension D=", d, " must be even");
  LOOM_CHECK(per_row_positions || t > 0, op, ": t must be positive when positions repeat every t rows");
  DeviceGuard guard(ctx.index, op);
  rope_kernel<<<grid_for(rows * heads * (d / 2), kThreads), kThreads, 0, ctx.stream>>>(
      out, x, cos, sin, rows, heads, t, d, per_row_positions, interleaved, inverse ? -1.0f : 1.0f);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

}  // namespace loom::cuda
