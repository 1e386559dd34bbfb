// Embedding kernels (embedding.h). The forward copies rows with one thread per element; the backward
// gives each thread one column and walks every token in order (deterministic, no atomics). That walk is
// N long per thread: fine for correctness and for GPT-2's N = B*T of a few thousand, and the place to
// start (sort ids, then segment sums) once a GPU run has timed it.
#include <climits>

#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/embedding.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// scan[0]: the smallest bad flat index (ULLONG_MAX when none); scan[1]: the count of ids != ignore.
__global__ void scan_ids_kernel(unsigned long long* scan, const int32_t* ids, int64_t N, int64_t V,
                                int64_t ignore_index) {
  unsigned long long count = 0, first = ULLONG_MAX;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[n];
    if (id == ignore_index) continue;
    ++count;
    if ((id < 0 || id >= V) && static_cast<unsigned long long>(n) < first) first = static_cast<unsigned long long>(n);
  }
  if (first != ULLONG_MAX) atomicMin(&scan[0], first);
  if (count != 0) atomicAdd(&scan[1], count);
}

template <typename Word>
__global__ void embedding_forward_kernel(Word* out, const int32_t* ids, const Word* table, int64_t N, int64_t V,
                                         int64_t row_words) {
  const int64_t total = N * row_words;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / row_words, c = i % row_words;
    const int32_t id = ids[n];
    out[i] = id >= 0 && id < V ? table[int64_t(id) * row_words + c] : Word(0);
  }
}

__global__ void embedding_backward_kernel(float* d_table, const int32_t* ids, const float* d_out, int64_t N,
                                          int64_t V, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t id = ids[n];
    if (id >= 0 && id < V) d_table[int64_t(id) * C + c] += d_out[n * C + c];
  }
}

}  // namespace

IdScan scan_ids(const Context& ctx, const int32_t* ids, int64_t N, int64_t V, int64_t ignore_index, const char* op) {
  IdScan result;
  if (N == 0) {
    result.count = 0;
    return result;
  }
  DeviceGuard guard(ctx.index, op);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(op, cudaStreamIsCapturing(ctx.stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return result;  // unchecked: see embedding.h
  Allocator& allocator = device_allocator(ctx.index);
  auto* scan = static_cast<unsigned long long*>(allocator.allocate(2 * sizeof(unsigned long long)));
  const unsigned long long init[2] = {ULLONG_MAX, 0};
  unsigned long long host[2] = {0, 0};
  cudaError_t e = cudaMemcpyAsync(scan, init, sizeof init, cudaMemcpyHostToDevice, ctx.stream);
  if (e == cudaSuccess) {
    scan_ids_kernel<<<grid_for(N, kThreads), kThreads, 0, ctx.stream>>>(scan, ids, N, V, ignore_index);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(host, scan, sizeof host, cudaMemcpyDeviceToHost, ctx.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctx.stream);
  allocator.deallocate(scan, 2 * sizeof(unsigned long long));
  LOOM_CUDA_CHECK(op, e);
  result.count = static_cast<int64_t>(host[1]);
  if (host[0] != ULLONG_MAX) {
    result.first_bad = static_cast<int64_t>(host[0]);
    LOOM_CUDA_CHECK(op, cudaMemcpy(&result.bad_value, ids + result.first_bad, sizeof(int32_t), cudaMemcpyDeviceToHost));
  }
  return result;
}

void embedding_forward(const Context& ctx, void* out, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t elem_bytes) {
  if (N == 0 || C == 0) return;
  LOOM_CHECK(elem_bytes == 4 || elem_bytes == 2, "embedding: element size ", elem_bytes, " is not 4 or 2");
  DeviceGuard guard(ctx.index, "embedding");
  if (elem_bytes == 4) {
    embedding_forward_kernel<<<grid_for(N * C, kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<uint32_t*>(out), ids, static_cast<const uint32_t*>(table), N, V, C);
  } else {
    embedding_forward_kernel<<<grid_for(N * C, kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<uint16_t*>(out), ids, static_cast<const uint16_t*>(table), N, V, C);
  }
  LOOM_CUDA_CHECK_LAUNCH("embedding");
}

void embedding_backward(const Context& ctx, float* d_table, const int32_t* ids, const float* d_out, int64_t N,
                        int64_t V, int64_t C) {
  if (V == 0 || C == 0) return;
  DeviceGuard guard(ctx.index, "embedding backward");
  LOOM_CUDA_CHECK("embedding backward", cudaMemsetAsync(d_table, 0, size_t(V * C) * sizeof(float), ctx.stream));
  if (N == 0) return;
  embedding_backward_kernel<<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(d_table, ids, d_out,
                                                                                                   N, V, C);
  LOOM_CUDA_CHECK_LAUNCH("embedding backward");
}

}  // namespace loom::cuda
