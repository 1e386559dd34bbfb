// The CUDA runtime as loom sees it: is a GPU there, per-device context (stream, allocator), copies.
//
// This header is plain C++ (no CUDA headers), so core code and tests include it in every build. Two
// implementations, chosen by CMake (a file, not an #ifdef, as with MPI):
//   * runtime.cpp, built when the CUDA toolkit is found (LOOM_CUDA=AUTO/ON): cudart, linked statically,
//     loads the driver (libcuda.so.1) itself at first use, so a machine with the toolkit but without a
//     driver or GPU (CI here) runs the same binary: device_count() is then 0, and nothing crashes.
//   * stub/no_cuda.cpp, built without the toolkit: device_count() is 0, and every device operation
//     throws an error saying this build has no CUDA backend.
//
// Conventions:
//   * Every failed CUDA call becomes a loom::Error naming loom's operation, the CUDA error's name and
//     string, and the file:line of the call ("copy to cuda:0: cudaErrorNoDevice (no CUDA-capable device
//     is detected) at src/backends/cuda/runtime.cpp:123").
//   * One compute stream per device (a non-blocking stream, so CUDA graphs can capture it), owned by that
//     device's Context. Kernels take the stream as an argument; ops pass context(device).stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/allocator.h"
#include "core/dtype.h"

// The runtime's own stream type (cudaStream_t is `CUstream_st*`), declared without its headers.
struct CUstream_st;

namespace loom {
class CachingAllocator;
}

namespace loom::cuda {

using Stream = CUstream_st*;

// True when this build has the CUDA backend compiled in (whether or not a GPU is present).
bool built();
// The number of GPUs the driver reports; 0 without a build, a driver or a device. Never throws.
int device_count();
// Why no GPU is usable ("no CUDA driver: ..."), or "" when at least one is.
std::string unavailable_reason();
// The toolkit's and the driver's versions, and each device's name and memory (for `loom info`).
std::string describe();

// Throws a loom::Error naming `op` unless `device` is a CUDA device this process can use.
void check_device(const char* op, Device device);
// The memory of cuda:`index` in bytes (what a run's memory estimate is checked against). Throws like
// check_device when the device is not usable.
size_t total_memory(int index);

// What an op needs to run on a device: its compute stream and its memory.
struct Context {
  int index = 0;
  Stream stream = nullptr;
};
// The context of cuda:`index`, created on first use (the stream, the allocator). Throws when the device
// is not usable.
Context& context(int index);
// The allocator of cuda:`index` (allocator_for(Device::cuda(i)) returns it), and the caching allocator
// under it (pools and guards for graph capture, detailed stats, empty_cache).
Allocator& device_allocator(int index);
CachingAllocator& caching_allocator(int index);

// Copies `bytes` between any two of host and CUDA memory, on the destination's (or, to the host, the
// source's) compute stream; returns when the copy is complete, so host memory may be read or reused.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const char* op);
// Sets `bytes` of device memory to zero (asynchronous, on the device's compute stream).
void zero(void* dst, Device device, size_t bytes, const char* op);
// Waits for all work queued on the device's compute stream; a failed kernel's error surfaces here.
void synchronize(Device device, const char* op);

}  // namespace loom::cuda

namespace loom {
// The public queries (c10 names): true when a GPU is usable by this build on this machine.
inline bool cuda_available() { return cuda::device_count() > 0; }
inline int cuda_device_count() { return cuda::device_count(); }
}  // namespace loom
