// Training on a device (training.device, `loom train --device`): which devices a run may use, moving a
// model's parameters there, copies back for the files a run writes, and the device's side of the
// memory check and of MFU's denominator. The CPU is the default; a CUDA GPU trains one process (the
// mesh's communicators are MPI's on host memory; NCCL's is not checked on GPUs yet: docs/cuda.md).
#pragma once

#include <string>

#include "core/tensor.h"
#include "models/model.h"
#include "runs/memory.h"

namespace loom::train {

// The device `text` names ("cpu", "cuda", "cuda:N"), checked before anything is read or written: a CUDA
// device this build cannot use is refused with the reason (no backend, no driver or GPU, no such index),
// and so is a CUDA device together with a mesh of several ranks (`mesh`, the config's parallel.mesh).
Device training_device(const std::string& text, const std::string& mesh, const char* what);

// Moves every parameter of `model`, and its state (DeepSeek-V3's routing biases), to `device`. The model
// is built on the host from the seed first, so the initial values are the CPU run's.
void move_to_device(models::LanguageModel& model, Device device);

// What the run's memory estimate is checked against: the host's budget on the CPU, the GPU's memory on
// a CUDA device (the parameters, gradients, moments and activations all live there).
runs::MemoryBudget memory_budget(Device device, const runs::MemoryBudget& host);

// MFU's denominator on a GPU, measured as bench train measures it (not read from a datasheet): 8192^3
// GEMMs through cuBLASLt in the step's precision (bf16 operands with f32 accumulation, or f32), 3
// untimed then 10 timed, in FLOP/s. Takes about a second.
double gpu_matrix_peak_flops(Device device, bool bf16);

}  // namespace loom::train
