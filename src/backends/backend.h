// How ops reach kernels.
//
// An op (src/ops/<family>.cpp) validates its arguments, allocates outputs on the inputs' device, and
// calls the kernel for that device: cpu::<kernel> from src/backends/cpu/<family>.h, or
// cuda::<kernel> from src/backends/cuda/<family>.h with the device's Context (its stream). Model code
// only ever calls ops, so adding a backend touches ops and backends, never models.
//
// An op whose family has no CUDA kernel yet calls require_cpu(); given a CUDA tensor it throws an error
// naming the op and the device (docs/cuda.md lists the ops that have CUDA kernels).
#pragma once

#include "backends/cuda/runtime.h"
#include "core/tensor.h"

namespace loom {

// Throws a clear error for a device whose backend this build lacks, or whose backend has no kernel
// for `op` yet.
[[noreturn]] void unsupported_device(const char* op, Device device);

// Checks that every defined tensor is on the CPU (ops with no kernel on another backend yet).
inline void require_cpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t != nullptr && t->defined() && !t->device().is_cpu()) unsupported_device(op, t->device());
  }
}

// For ops with kernels on several backends: the device all defined tensors share (an error names the
// op and both devices otherwise), checked to be usable by this build and machine.
Device dispatch_device(const char* op, std::initializer_list<const Tensor*> tensors);

// The CUDA context (stream, device index) an op's kernels run with on `device`.
cuda::Context& cuda_context(const char* op, Device device);

// For the programs that place a whole model on a device (`loom train/generate --device`, Python's
// device=): the device named by `text` ("cpu", "cuda", "cuda:1"), checked to hold a model. The CPU
// passes. A CUDA device gets one error naming it and why it cannot be used: this build has no CUDA
// backend, no CUDA driver, no GPU, or no such index; and, with a usable GPU, that decoding and the Python
// models do not run on CUDA yet (training does: train/device.h). `what` starts the message.
Device model_device(const std::string& text, const char* what);

// The device `text` names, parsed and, for a CUDA device, checked to be usable by this build on this
// machine (the same errors as model_device's, less the models' refusal): `loom train --device`'s start.
Device usable_device(const std::string& text, const char* what);

}  // namespace loom
