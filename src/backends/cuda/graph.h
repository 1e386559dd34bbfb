// The CUDA side of core/step_capture.h: a training step captured once into a CUDA graph and replayed.
#pragma once

#include <memory>

#include "core/step_capture.h"

namespace loom::cuda {

// Warm-up steps run eagerly with the device's allocator in a private pool, so the blocks the step needs
// are cached; the next step is captured on the device's compute stream with no new memory allowed (a
// request the cache cannot serve is an error naming it), and later calls launch the graph. The pool
// keeps the graph's memory out of everyone else's reach until reset() or destruction.
std::unique_ptr<StepCapture> make_graph_step_capture(int device, StepCaptureOptions options);

}  // namespace loom::cuda
