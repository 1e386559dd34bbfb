// Device helpers shared by the CUDA kernels: bf16 <-> f32 with the CPU's rounding, and block sums.
#pragma once

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

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

}  // namespace loom::cuda
