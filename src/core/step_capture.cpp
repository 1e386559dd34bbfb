#include "core/step_capture.h"

#include "core/allocator.h"
#include "core/hooks.h"

namespace loom {
namespace {

class EagerStepCapture final : public StepCapture {
 public:
  EagerStepCapture(Device device, StepCaptureOptions options) : device_(device), options_(options) {
    LOOM_CHECK(options.warmup_steps >= 0, "step capture: warmup_steps must be >= 0, got ", options.warmup_steps);
  }

  void run(const Step& step) override {
    Allocator& allocator = allocator_for(device_);
    const int64_t before = allocator.stats().system_allocations;
    step();
    const int64_t taken = allocator.stats().system_allocations - before;
    ++stats_.steps;
    ++stats_.eager_steps;
    if (++since_reset_ <= options_.warmup_steps || taken == 0) return;
    ++stats_.steps_with_new_memory;
    stats_.new_allocations_after_warmup += taken;
    LOOM_CHECK(!options_.strict, "step capture (", device_, "): step ", since_reset_, " took ", taken,
               " new block", taken == 1 ? "" : "s", " of memory after ", options_.warmup_steps,
               " warm-up step", options_.warmup_steps == 1 ? "" : "s",
               "; a replayable step requests the same sizes every time (docs/cuda.md)");
  }

  void reset() override { since_reset_ = 0; }
  std::string kind() const override { return "eager"; }
  StepCaptureStats stats() const override { return stats_; }

 private:
  Device device_;
  StepCaptureOptions options_;
  int64_t since_reset_ = 0;
  StepCaptureStats stats_;
};

}  // namespace

std::unique_ptr<StepCapture> make_step_capture(Device device, StepCaptureOptions options) {
  if (device.is_cuda()) return hooks::make_device_step_capture(device, options);
  return std::make_unique<EagerStepCapture>(device, options);
}

}  // namespace loom
