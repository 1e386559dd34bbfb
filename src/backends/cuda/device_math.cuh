// Device helpers shared by the CUDA kernels: bf16 <-> f32 with the CPU's rounding, block sums and maxima, and
// loom's counter-based random stream (Philox4x32-10, core/rng.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace loom::cuda {

// Same bits as loom::bf16::from_float/to_float (round to nearest even; NaN stays a quiet NaN), so a
// kernel's bf16 output can be compared bit for bit with the CPU's.
__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float load_f32(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const bf16* p, int64_t i) {
  return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
}
__device__ __forceinline__ void store_f32(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(bf16* p, int64_t i, float v) {
  reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread. The order is
// fixed by the block shape, so results repeat bit for bit. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Max over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread. `scratch`
// holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// random_bits(key, index) of core/rng.cpp, on the device: word index % 4 of the Philox4x32-10 block with
// counter (index / 4, 0, 0) under key (k0, k1). The same constants and rounds as core/rng.cpp's
// philox4x32 (the definition) and backends/cpu/philox.h; tests compare the masks bit for bit.
__device__ __forceinline__ uint32_t random_bits(uint32_t k0, uint32_t k1, uint64_t index) {
  const uint64_t block = index >> 2;
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const uint32_t words[4] = {c0, c1, c2, c3};
  return words[index & 3];
}

// Element `index` of the stream is dropped iff its uniform (bits >> 8) * 2^-24 is < p, i.e. iff
// (bits >> 8) < threshold with threshold = ceil(p * 2^24) (cpu::philox::drop_threshold, computed on the
// host): the comparison is exact, so the mask is the CPU's bit for bit.
__device__ __forceinline__ bool keep_element(uint32_t k0, uint32_t k1, uint64_t index, uint32_t threshold) {
  return (random_bits(k0, k1, index) >> 8) >= threshold;
}

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

}  // namespace loom::cuda
