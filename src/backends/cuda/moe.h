// CUDA routed experts: the contract of cpu::moe_experts_{forward,backward} (backends/cpu/moe.h: legend,
// dispatch layout, h1/h3 saved in row order, the same backward formulation) on device memory, queued on
// ctx's stream. The dispatch (a counting sort of expert_index) is computed on the host by
// moe_dispatch; its two permutations are passed as device arrays, its offsets as the host copy.
//
// Per expert, the rows of its run go through cuBLASLt GEMMs (a grouped GEMM as one cuBLASLt call per
// non-empty expert); gathers, the SwiGLU, the per-row backward and the combines are small kernels. The
// combines sum a token's K slots in k order, and each weight gradient is one GEMM over its expert's rows:
// no atomics, the same bits every run. Operand dtype T (float or bf16) as on the CPU: GEMM operands in T,
// accumulation, outputs and the saved h1/h3 in f32.
#pragma once

#include <cstdint>

#include "backends/moe_dispatch.h"
#include "backends/cuda/runtime.h"
#include "core/dtype.h"

namespace loom::cuda {

struct MoeDeviceDispatch {
  const MoeDispatch* host = nullptr;  // N, K, E, offsets
  const int32_t* slot_of_row = nullptr;    // [P] on the device
  const int32_t* row_of_slot = nullptr;    // [P] on the device
};

template <typename T>
void moe_experts_forward(const Context& ctx, const MoeDeviceDispatch& d, const T* x, const float* gates, const T* w1,
                         const T* w3, const T* w2, int64_t C, int64_t F, float* y, float* h1, float* h3);

template <typename T>
void moe_experts_backward(const Context& ctx, const MoeDeviceDispatch& d, const float* dy, const T* x,
                          const float* gates, const T* w1, const T* w3, const T* w2, const float* h1, const float* h3,
                          int64_t C, int64_t F, float* dx, float* dgates, float* dw1, float* dw3, float* dw2);

}  // namespace loom::cuda
