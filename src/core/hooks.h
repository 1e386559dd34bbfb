// What core needs from the floors above it (docs/architecture.md): declared here, defined there, so that
// core includes nothing above itself and the linker, not an #include, joins the two. Each function has
// exactly one definition in a build (a missing one is a link error, not a surprise at run time):
//   device memory, copies and step capture   backends/core_hooks.cpp (CUDA's runtime, or its stub when
//                                             the build has no CUDA: CMake picks the file, as for MPI)
//   the host's f32 -> bf16 pass               backends/core_hooks.cpp (the CPU backend's SIMD copies)
//   gradient sums                             ops/elementwise.cpp (ops owns the device dispatch)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/step_capture.h"

namespace loom {
class Tensor;
}

namespace loom::hooks {

// A device other than the host (a GPU): its caching allocator; a copy of `bytes` between any two of host
// and device memory, complete on return; zeroing `bytes` of its memory; a step capture that records a
// graph. Errors name `op`.
Allocator& device_allocator(Device device);
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const char* op);
void device_zero(void* dst, Device device, size_t bytes, const char* op);
std::unique_ptr<StepCapture> make_device_step_capture(Device device, StepCaptureOptions options);
// n elements of `from` at src -> `to` at dst, both in that device's memory, queued on its stream; false
// when the device has no kernel for the pair (the caller then converts through the host).
bool device_convert(void* dst, DType to, const void* src, DType from, int64_t n, Device device);

// in [n] f32 -> out [n] bf16, rounded to nearest even, on the host (Tensor::to(DType::BF16)).
void convert_f32_to_bf16(const float* in, bf16* out, int64_t n);

// The autodiff engine's gradient sums, on the gradients' device: a + b as a new tensor, and dst += src.
Tensor add_gradients(const Tensor& a, const Tensor& b);
void add_gradient_into(Tensor& dst, const Tensor& src);

}  // namespace loom::hooks
