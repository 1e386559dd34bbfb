// The CUDA runtime behind runtime.h: device discovery that never crashes, per-device contexts, the
// caching allocator's raw memory (cudaMalloc) and events, and copies.
#include "backends/cuda/runtime.h"

#include <array>
#include <memory>
#include <mutex>

#include "backends/cuda/check.h"
#include "core/caching_allocator.h"

namespace loom::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Probe {
  int count = 0;
  std::string reason;
};

// Asked once: cudart (static) looks for the driver library at its first call and answers with an error
// code, not a crash, when there is none (cudaErrorInsufficientDriver) or no GPU (cudaErrorNoDevice).
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason = str("no usable CUDA GPU: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
      if (e == cudaErrorInsufficientDriver) r.reason += "; is the NVIDIA driver (libcuda.so.1) installed?";
      return r;
    }
    if (n <= 0) {
      r.reason = "no usable CUDA GPU: the driver reports no device";
      return r;
    }
    r.count = std::min(n, kMaxDevices);
    return r;
  }();
  return p;
}

class CudaMemoryBackend final : public DeviceMemoryBackend {
 public:
  explicit CudaMemoryBackend(int index) : index_(index) {}
  void* raw_allocate(size_t bytes) override {
    DeviceGuard guard(index_, "cudaMalloc");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;  // the allocator frees its cache and retries, then reports
    }
    check_cuda(e, device_name().c_str(), "cudaMalloc", __FILE__, __LINE__);
    return p;
  }
  void raw_free(void* ptr) override {
    DeviceGuard guard(index_, "cudaFree");
    LOOM_CUDA_CHECK("cudaFree", cudaFree(ptr));
  }
  EventId record_event(StreamId stream) override {
    DeviceGuard guard(index_, "record_event");
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK("allocator event", cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    LOOM_CUDA_CHECK("allocator event", cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream)));
    return reinterpret_cast<EventId>(event);
  }
  bool event_done(EventId event) override {
    const cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LOOM_CUDA_CHECK("allocator event", e);
    return true;
  }
  void destroy_event(EventId event) override { (void)cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)); }
  std::string device_name() const override { return Device::cuda(index_).str(); }

 private:
  int index_;
};

// Allocator's interface over the caching allocator, on the device's compute stream.
class CudaDeviceAllocator final : public Allocator {
 public:
  CudaDeviceAllocator(int index, Stream stream)
      : caching_(std::make_unique<CudaMemoryBackend>(index)), stream_(reinterpret_cast<StreamId>(stream)) {}
  void* allocate(size_t bytes) override { return caching_.allocate(bytes, stream_); }
  void deallocate(void* ptr, size_t) override { caching_.free(ptr); }
  AllocatorStats stats() const override {
    const CachingAllocatorStats s = caching_.stats();
    AllocatorStats out;
    out.system_allocations = s.raw_allocations;
    out.cache_hits = s.cache_hits;
    out.bytes_in_use = s.allocated_bytes;
    out.bytes_reserved = s.reserved_bytes;
    out.peak_bytes_in_use = s.peak_allocated_bytes;
    return out;
  }
  void release_cache() override { caching_.empty_cache(); }
  void reset_peak() override { caching_.reset_peak(); }
  CachingAllocator& caching() { return caching_; }

 private:
  CachingAllocator caching_;
  StreamId stream_;
};

struct DeviceState {
  Context context;
  std::unique_ptr<CudaDeviceAllocator> allocator;
};

// Leaked on purpose: tensors in static objects may be freed after main returns, and the driver may be
// shutting down by then.
DeviceState& state(int index) {
  static std::mutex mutex;
  static auto* states = new std::array<std::unique_ptr<DeviceState>, kMaxDevices>();
  check_device("cuda context", Device::cuda(index));  // also bounds index by the device count (<= 64)
  std::lock_guard<std::mutex> lock(mutex);
  auto& s = (*states)[static_cast<size_t>(index)];
  if (!s) {
    auto made = std::make_unique<DeviceState>();
    DeviceGuard guard(index, "cuda context");
    cudaStream_t stream = nullptr;
    LOOM_CUDA_CHECK("cuda context", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    made->context.index = index;
    made->context.stream = stream;
    made->allocator = std::make_unique<CudaDeviceAllocator>(index, stream);
    s = std::move(made);
  }
  return *s;
}

}  // namespace

bool built() { return true; }
int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().count > 0 ? "" : probe().reason; }

std::string describe() {
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) (void)cudaGetLastError();
  std::string s = str("CUDA runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver ",
                      driver == 0 ? std::string("none") : str(driver / 1000, ".", driver % 1000 / 10));
  if (device_count() == 0) return s + "; " + unavailable_reason();
  for (int i = 0; i < device_count(); ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    s += str("; cuda:", i, " ", prop.name, " (sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount,
             " SMs, ", prop.totalGlobalMem >> 20, " MiB)");
  }
  return s;
}

void check_device(const char* op, Device device) {
  LOOM_CHECK(device.is_cuda(), op, ": ", device, " is not a CUDA device");
  const int n = device_count();
  LOOM_CHECK(n > 0, op, ": cannot use ", device, ": ", unavailable_reason());
  LOOM_CHECK(device.index() < n, op, ": ", device, " does not exist: this machine has ", n, " GPU",
             n == 1 ? "" : "s", " (cuda:0", n > 1 ? str("..cuda:", n - 1) : std::string(), ")");
}

size_t total_memory(int index) {
  check_device("total_memory", Device::cuda(index));
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK("total_memory", cudaGetDeviceProperties(&prop, index));
  return prop.totalGlobalMem;
}

Context& context(int index) { return state(index).context; }
Allocator& device_allocator(int index) { return *state(index).allocator; }
CachingAllocator& caching_allocator(int index) { return state(index).allocator->caching(); }

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const char* op) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // The stream of the GPU side (the destination's when both are GPUs). Unified addressing lets
  // cudaMemcpyDefault work out the direction, also between two GPUs.
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  check_device(op, dst_device.is_cuda() ? dst_device : src_device);
  if (src_device.is_cuda()) check_device(op, src_device);
  Context& ctx = context(gpu.index());
  DeviceGuard guard(gpu.index(), op);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // The source's queued writes must land first.
    LOOM_CUDA_CHECK(op, cudaStreamSynchronize(context(src_device.index()).stream));
  }
  LOOM_CUDA_CHECK(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx.stream));
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    // Host memory may be read or reused as soon as we return.
    LOOM_CUDA_CHECK(op, cudaStreamSynchronize(ctx.stream));
  }
}

void zero(void* dst, Device device, size_t bytes, const char* op) {
  if (bytes == 0) return;
  check_device(op, device);
  Context& ctx = context(device.index());
  DeviceGuard guard(device.index(), op);
  LOOM_CUDA_CHECK(op, cudaMemsetAsync(dst, 0, bytes, ctx.stream));
}

void synchronize(Device device, const char* op) {
  check_device(op, device);
  Context& ctx = context(device.index());
  DeviceGuard guard(device.index(), op);
  LOOM_CUDA_CHECK(op, cudaStreamSynchronize(ctx.stream));
}

}  // namespace loom::cuda
