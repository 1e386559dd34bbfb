// Shape kernels (shape.h): one thread per element moved, the element's bytes as one word of its size.
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/shape.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

template <typename W>
__global__ void copy_rows_kernel(const W* src, int64_t src_len, int64_t src_off, W* dst, int64_t dst_len,
                                 int64_t dst_off, int64_t outer, int64_t run) {
  // run = len * inner elements per row; element i of row o.
  const int64_t n = outer * run;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = k / run, i = k % run;
    dst[o * dst_len + dst_off + i] = src[o * src_len + src_off + i];
  }
}

template <typename W>
__global__ void transpose_kernel(const W* x, W* out, int64_t A, int64_t n0, int64_t M, int64_t n1, int64_t I) {
  const int64_t n = A * n0 * M * n1 * I;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    // k indexes out [A, n1, M, n0, I].
    int64_t r = k;
    const int64_t i = r % I;
    r /= I;
    const int64_t j0 = r % n0;
    r /= n0;
    const int64_t m = r % M;
    r /= M;
    const int64_t j1 = r % n1;
    const int64_t a = r / n1;
    out[k] = x[(((a * n0 + j0) * M + m) * n1 + j1) * I + i];
  }
}

template <typename F>
void by_width(size_t elem, const char* op, F&& f) {
  switch (elem) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: LOOM_FAIL(op, ": unsupported element size ", elem, " bytes");
  }
}

}  // namespace

void copy_rows(const Context& ctx, const void* src, int64_t src_len, int64_t src_off, void* dst, int64_t dst_len,
               int64_t dst_off, int64_t outer, int64_t len, int64_t inner, size_t elem, const char* op) {
  if (outer == 0 || len == 0 || inner == 0) return;
  DeviceGuard guard(ctx.index, op);
  by_width(elem, op, [&](auto w) {
    using W = decltype(w);
    // Offsets in elements: rows of src_len * inner, the run starting at src_off * inner.
    copy_rows_kernel<W><<<grid_for(outer * len * inner, kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<const W*>(src), src_len * inner, src_off * inner, static_cast<W*>(dst), dst_len * inner,
        dst_off * inner, outer, len * inner);
  });
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void transpose_copy(const Context& ctx, const void* x, void* out, int64_t A, int64_t n0, int64_t M, int64_t n1,
                    int64_t I, size_t elem) {
  const int64_t n = A * n0 * M * n1 * I;
  if (n == 0) return;
  DeviceGuard guard(ctx.index, "transpose");
  by_width(elem, "transpose", [&](auto w) {
    using W = decltype(w);
    transpose_kernel<W><<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(static_cast<const W*>(x),
                                                                           static_cast<W*>(out), A, n0, M, n1, I);
  });
  LOOM_CUDA_CHECK_LAUNCH("transpose");
}

}  // namespace loom::cuda
