// Running a training step so that it can be replayed: the trainer hands its step (forward, backward,
// clip, AdamW) to a StepCapture instead of calling it.
//   * CPU (EagerStepCapture): the step runs each time. The capture checks the step's promise that,
//     after warm-up, it takes no new memory from the allocator (docs/engine.md), and reports it.
//   * CUDA (cuda::make_graph_step_capture, src/backends/cuda/graph.h, reached through core/hooks.h): the warm-up steps run eagerly in a
//     private memory pool, the next step is captured once into a CUDA graph, and every later call
//     replays the graph (one launch for the whole step).
//
// What a step must do for replay to be valid (the same contract on every device, so a step that works on
// the CPU works under a graph):
//   * the same ops on the same shapes every call;
//   * inputs read from tensors that exist before the step (the trainer copies each batch into the same
//     device tensors before run()); results written into tensors it reads after run() returns;
//   * no reads of device values on the host inside the step (item(), to(cpu)): the host does not run
//     during a replay;
//   * after warm-up, no new memory: each step frees what it allocates, or holds the same buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace loom {

struct StepCaptureOptions {
  int warmup_steps = 2;  // eager steps before capture (two: gradients made in step 1 are freed in step 2)
  // CPU: throw when a step after warm-up took new memory (off by default: other threads, such as data
  // loading, share the CPU allocator and would be counted).
  bool strict = false;
};

struct StepCaptureStats {
  int64_t steps = 0;         // run() calls
  int64_t eager_steps = 0;   // steps run directly
  int64_t captures = 0;      // graphs recorded
  int64_t replays = 0;       // graph launches
  int64_t steps_with_new_memory = 0;  // steps after warm-up that took memory from the system/driver
  int64_t new_allocations_after_warmup = 0;
};

class StepCapture {
 public:
  using Step = std::function<void()>;
  virtual ~StepCapture() = default;
  // Runs one step: `step` itself, or a replay of its capture. Pass the same step every call.
  virtual void run(const Step& step) = 0;
  // Forgets the capture (after a change of shapes, say): the next calls warm up and capture again.
  virtual void reset() = 0;
  virtual std::string kind() const = 0;  // "eager" or "cuda-graph"
  virtual StepCaptureStats stats() const = 0;
};

// The capture for steps whose tensors live on `device`.
std::unique_ptr<StepCapture> make_step_capture(Device device, StepCaptureOptions options = {});

}  // namespace loom
