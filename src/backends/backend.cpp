#include "backends/backend.h"

namespace loom {

void unsupported_device(const char* op, Device device) {
  if (device.is_cuda() && cuda::built()) {
    LOOM_FAIL(op, ": the CUDA backend has no kernel for this op yet (an input is on ", device,
              "); move the tensors to the CPU with .to(Device::cpu()), or see docs/cuda.md for the ops it has");
  }
  LOOM_FAIL(op, ": no kernel for device ", device, " in this build (backends built: cpu",
            cuda::built() ? ", cuda" : "", device.is_cuda() ? "; it was built without the CUDA toolkit" : "", ")");
}

Device dispatch_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else {
      LOOM_CHECK(t->device() == first->device(), op, ": tensors are on different devices (", first->device(),
                 " and ", t->device(), ")");
    }
  }
  LOOM_CHECK(first != nullptr, op, ": no defined tensor to dispatch on");
  const Device device = first->device();
  if (device.is_cuda()) cuda::check_device(op, device);
  return device;
}

cuda::Context& cuda_context(const char* op, Device device) {
  cuda::check_device(op, device);
  return cuda::context(device.index());
}

Device usable_device(const std::string& text, const char* what) {
  Device device;
  try {
    device = Device::parse(text);
  } catch (const Error& e) {
    LOOM_FAIL(what, ": ", e.what());
  }
  if (device.is_cuda()) cuda::check_device(what, device);  // no backend, driver, GPU or index: the reason
  return device;
}

Device model_device(const std::string& text, const char* what) {
  const Device device = usable_device(text, what);
  if (device.is_cpu()) return device;
  LOOM_FAIL(what, ": ", device, " is usable, but loom's decoding and Python models do not run on CUDA yet (the "
            "KV caches and samplers assume host tensors; `loom train --device cuda` does: docs/cuda.md); use the "
            "CPU (device cpu)");
}

}  // namespace loom
