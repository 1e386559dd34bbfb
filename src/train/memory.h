// The memory a training run will need, from its config, before anything is allocated (the terms and the
// budget it is held to: runs/memory.h).
#pragma once

#include "runs/memory.h"
#include "train/config.h"

namespace loom::train {

// `loom train`: training steps, the fixed validation batches, the KV cache of the samples at the end.
runs::MemoryEstimate training_memory(const TrainConfig& config);

}  // namespace loom::train
