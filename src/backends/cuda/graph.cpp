// CUDA graph capture of a training step (graph.h); CudaStepCapture.* passed on an H200 (docs/cuda.md).
#include "backends/cuda/graph.h"

#include <atomic>

#include "backends/cuda/check.h"
#include "backends/cuda/runtime.h"
#include "core/caching_allocator.h"

namespace loom::cuda {
namespace {

std::atomic<PoolId> next_pool{1};

class GraphStepCapture final : public StepCapture {
 public:
  GraphStepCapture(int device, StepCaptureOptions options)
      : device_(device), options_(options), pool_(next_pool.fetch_add(1)) {
    LOOM_CHECK(options.warmup_steps >= 1, "step capture (cuda:", device,
               "): warmup_steps must be >= 1 (the allocator must have cached the step's blocks), got ",
               options.warmup_steps);
    check_device("step capture", Device::cuda(device));
  }
  ~GraphStepCapture() override {
    try {
      reset();
    } catch (...) {  // a destructor must not throw; the driver may already be gone at exit
    }
  }

  void run(const Step& step) override {
    Context& ctx = context(device_);
    CachingAllocator& allocator = caching_allocator(device_);
    DeviceGuard guard(device_, "step capture");
    ++stats_.steps;
    if (exec_ != nullptr) {
      LOOM_CUDA_CHECK("step replay", cudaGraphLaunch(exec_, ctx.stream));
      ++stats_.replays;
      return;
    }
    if (since_reset_ < options_.warmup_steps) {
      // Warm up in the private pool, so the capture finds every block it needs cached there.
      allocator.begin_pool(pool_);
      try {
        step();
      } catch (...) {
        allocator.end_pool();
        throw;
      }
      allocator.end_pool();
      ++since_reset_;
      ++stats_.eager_steps;
      return;
    }
    // Capture: the step's kernels are recorded, not run; then the graph runs once for this step.
    allocator.begin_pool(pool_);
    cudaGraph_t graph = nullptr;
    try {
      CachingAllocator::NoNewMemoryGuard no_new(allocator, "step capture");
      LOOM_CUDA_CHECK("step capture", cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
      try {
        step();
      } catch (...) {
        (void)cudaStreamEndCapture(ctx.stream, &graph);
        if (graph != nullptr) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        throw;
      }
      LOOM_CUDA_CHECK("step capture", cudaStreamEndCapture(ctx.stream, &graph));
    } catch (...) {
      allocator.end_pool();
      throw;
    }
    allocator.end_pool();
    graph_ = graph;
    LOOM_CUDA_CHECK("step capture", cudaGraphInstantiate(&exec_, graph_, 0));
    ++stats_.captures;
    LOOM_CUDA_CHECK("step replay", cudaGraphLaunch(exec_, ctx.stream));
    ++stats_.replays;
  }

  void reset() override {
    if (exec_ != nullptr || graph_ != nullptr) {
      DeviceGuard guard(device_, "step capture reset");
      synchronize(Device::cuda(device_), "step capture reset");
      if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
      if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
      exec_ = nullptr;
      graph_ = nullptr;
    }
    if (since_reset_ > 0) caching_allocator(device_).release_pool(pool_);
    since_reset_ = 0;
  }

  std::string kind() const override { return "cuda-graph"; }
  StepCaptureStats stats() const override { return stats_; }

 private:
  int device_;
  StepCaptureOptions options_;
  PoolId pool_;
  int since_reset_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  StepCaptureStats stats_;
};

}  // namespace

std::unique_ptr<StepCapture> make_graph_step_capture(int device, StepCaptureOptions options) {
  return std::make_unique<GraphStepCapture>(device, options);
}

}  // namespace loom::cuda
