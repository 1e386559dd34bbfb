// How ops reach kernels.
//
// An op (src/ops/<family>.cpp) validates its arguments, allocates outputs on the inputs' device, and
// calls the kernel for that device: cpu::<kernel> from src/backends/cpu/<family>.h today, and
// cuda::<kernel> from src/backends/cuda/<family>.h once that backend exists. Model code only ever calls
// ops, so adding a backend touches ops and backends, never models.
#pragma once

#include "core/tensor.h"

namespace loom {

// Throws a clear error for a device whose backend this build lacks.
[[noreturn]] void unsupported_device(const char* op, Device device);

// Checks that every defined tensor is on the CPU backend (the only one built so far).
inline void require_cpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t != nullptr && t->defined() && !t->device().is_cpu()) unsupported_device(op, t->device());
  }
}

}  // namespace loom
