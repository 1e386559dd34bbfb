// The CUDA backend of a build without the CUDA toolkit: the device queries answer "no GPU", and
// everything that would touch a GPU throws an error saying so. Chosen by CMake (cmake/cuda.cmake)
// instead of the backend's sources, so nothing else in loom has an #ifdef.
#include "backends/cuda/graph.h"
#include "backends/cuda/runtime.h"
#include "core/caching_allocator.h"

namespace loom::cuda {
namespace {
[[noreturn]] void not_built(const std::string& what) {
  LOOM_FAIL(what, ": this loom was built without the CUDA backend (no CUDA toolkit was found when it was "
                  "configured; install it and reconfigure with -DLOOM_CUDA=ON, see docs/cuda.md)");
}
}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this loom was built without the CUDA backend"; }
std::string describe() { return "CUDA backend not built"; }
void check_device(const char* op, Device device) { not_built(str(op, ": cannot use ", device)); }
Context& context(int index) { not_built(str("context of cuda:", index)); }
Allocator& device_allocator(int index) { not_built(str("allocator of cuda:", index)); }
CachingAllocator& caching_allocator(int index) { not_built(str("allocator of cuda:", index)); }
void copy(void*, Device, const void*, Device, size_t, const char* op) { not_built(op); }
void zero(void*, Device, size_t, const char* op) { not_built(op); }
void synchronize(Device, const char* op) { not_built(op); }

std::unique_ptr<StepCapture> make_graph_step_capture(int, StepCaptureOptions) { not_built("step capture"); }

}  // namespace loom::cuda
