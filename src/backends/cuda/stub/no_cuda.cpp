// The CUDA backend of a build without the CUDA toolkit: the device queries answer "no GPU", and
// everything that would touch a GPU throws an error saying so. Chosen by CMake (cmake/cuda.cmake)
// instead of the backend's sources, so nothing else in loom has an #ifdef.
#include "backends/cuda/elementwise.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/graph.h"
#include "backends/cuda/nccl/nccl_communicator.h"
#include "backends/cuda/norm.h"
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

// Kernels: unreachable in practice (no CUDA tensor can be made without the backend), but they must link.
void add_forward(const Context&, float*, const float*, const float*, int64_t) { not_built("add"); }
void add_forward(const Context&, bf16*, const bf16*, const bf16*, int64_t) { not_built("add"); }
void add_inplace(const Context&, float*, const float*, int64_t) { not_built("add_"); }
void mul_forward(const Context&, float*, const float*, const float*, int64_t) { not_built("mul"); }
void scale_forward(const Context&, float*, const float*, float, int64_t) { not_built("scale"); }
void convert_f32_to_bf16(const Context&, bf16*, const float*, int64_t) { not_built("to(bf16)"); }
void convert_bf16_to_f32(const Context&, float*, const bf16*, int64_t) { not_built("to(f32)"); }
void rms_norm_forward(const Context&, float*, float*, const float*, const float*, int64_t, int64_t, float) {
  not_built("rms_norm");
}
void rms_norm_forward(const Context&, bf16*, float*, const bf16*, const float*, int64_t, int64_t, float) {
  not_built("rms_norm");
}
void rms_norm_backward(const Context&, float*, float*, const float*, const float*, const float*, const float*,
                       int64_t, int64_t) {
  not_built("rms_norm backward");
}
void rms_norm_backward(const Context&, bf16*, float*, const bf16*, const bf16*, const float*, const float*,
                       int64_t, int64_t) {
  not_built("rms_norm backward");
}
void gemm(const Context&, const GemmProblem&) { not_built("gemm"); }
void gemm(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
          float, float*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}
void gemm_bf16(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t, const bf16*,
               int64_t, float, float*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}
void gemm_bf16(const Context&, bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t, const bf16*,
               int64_t, float, bf16*, int64_t, const float*, GemmEpilogue) {
  not_built("gemm");
}

bool nccl_built() { return false; }
std::unique_ptr<dist::Communicator> make_nccl_communicator(std::shared_ptr<dist::Communicator>, int,
                                                           std::chrono::milliseconds) {
  not_built("nccl communicator");
}

}  // namespace loom::cuda
