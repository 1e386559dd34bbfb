// Inside the CUDA backend only (includes the CUDA headers): checked CUDA and cuBLAS calls.
//
// LOOM_CUDA_CHECK(op, call) turns a failed call into a loom::Error that names loom's operation, the
// CUDA error's name and text, the call and where it is: "rms_norm: cudaErrorNoDevice (no CUDA-capable
// device is detected) from cudaSetDevice(0) at src/backends/cuda/runtime.cpp:57".
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstring>

#include "core/error.h"

namespace loom::cuda {

// "src/backends/cuda/x.cu" from an absolute __FILE__.
inline const char* source_path(const char* file) {
  const char* p = std::strstr(file, "src/");
  return p != nullptr ? p : file;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* op, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  throw Error(str(op, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") from ", call, " at ",
                  source_path(file), ":", line));
}

inline void check_cuda(cudaError_t e, const char* op, const char* call, const char* file, int line) {
  if (e != cudaSuccess) [[unlikely]] throw_cuda_error(e, op, call, file, line);
}

// The status's name without calling into cuBLASLt (it is loaded lazily: gemm.cpp).
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "cuBLAS status";
  }
}

inline void check_cublas(cublasStatus_t s, const char* op, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    throw Error(str(op, ": cuBLAS ", cublas_status_name(s), " (", static_cast<int>(s), ") from ", call, " at ",
                    source_path(file), ":", line));
  }
}

// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* op) {
    check_cuda(cudaGetDevice(&previous_), op, "cudaGetDevice", __FILE__, __LINE__);
    if (previous_ != index) check_cuda(cudaSetDevice(index), op, "cudaSetDevice", __FILE__, __LINE__);
  }
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace loom::cuda

#define LOOM_CUDA_CHECK(op, call) ::loom::cuda::check_cuda((call), (op), #call, __FILE__, __LINE__)
#define LOOM_CUBLAS_CHECK(op, call) ::loom::cuda::check_cublas((call), (op), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here; a fault inside the kernel at the next sync.
#define LOOM_CUDA_CHECK_LAUNCH(op) ::loom::cuda::check_cuda(cudaGetLastError(), (op), "kernel launch", __FILE__, __LINE__)
