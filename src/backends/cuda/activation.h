// CUDA kernels for the activations family: so far dropout (the contract of cpu::dropout_forward), on
// device memory, queued on ctx's stream.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace loom::cuda {

// Inverted dropout, y[i] = keep(i) ? x[i] * (1 / (1 - p)) : 0 with keep(i) = !(random_uniform(key, i) < p):
// the CPU's mask and arithmetic, so y equals cpu::dropout_forward's bit for bit. The backward is the same
// call on dy (same key: same mask). y may equal x.
void dropout_forward(const Context& ctx, float* y, const float* x, int64_t n, float p, RngKey key);
void dropout_forward(const Context& ctx, bf16* y, const bf16* x, int64_t n, float p, RngKey key);

}  // namespace loom::cuda
