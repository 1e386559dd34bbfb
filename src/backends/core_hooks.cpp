// core/hooks.h's device and conversion hooks, defined by the backends: the CUDA runtime (or, in a build
// without CUDA, its stub, which says so) for device memory and graphs, the CPU backend's SIMD pass for
// the host's f32 -> bf16 conversion.
#include "core/hooks.h"

#include "backends/cpu/elementwise.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/graph.h"
#include "backends/cuda/runtime.h"
#include "core/error.h"

namespace loom::hooks {

Allocator& device_allocator(Device device) {
  LOOM_ASSERT(device.is_cuda(), "device_allocator: ", device.str(), " is not a CUDA device");
  return cuda::device_allocator(device.index());
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const char* op) {
  cuda::copy(dst, dst_device, src, src_device, bytes, op);
}

void device_zero(void* dst, Device device, size_t bytes, const char* op) { cuda::zero(dst, device, bytes, op); }

std::unique_ptr<StepCapture> make_device_step_capture(Device device, StepCaptureOptions options) {
  LOOM_ASSERT(device.is_cuda(), "make_device_step_capture: ", device.str(), " is not a CUDA device");
  return cuda::make_graph_step_capture(device.index(), options);
}

bool device_convert(void* dst, DType to, const void* src, DType from, int64_t n, Device device) {
  LOOM_ASSERT(device.is_cuda(), "device_convert: ", device.str(), " is not a CUDA device");
  const cuda::Context& ctx = cuda::context(device.index());
  if (from == DType::F32 && to == DType::BF16) {
    cuda::convert_f32_to_bf16(ctx, static_cast<bf16*>(dst), static_cast<const float*>(src), n);
    return true;
  }
  if (from == DType::BF16 && to == DType::F32) {
    cuda::convert_bf16_to_f32(ctx, static_cast<float*>(dst), static_cast<const bf16*>(src), n);
    return true;
  }
  return false;
}

void convert_f32_to_bf16(const float* in, bf16* out, int64_t n) { cpu::convert_f32_to_bf16(in, out, n); }

}  // namespace loom::hooks
