#include "core/allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/hooks.h"

namespace loom {
namespace {

constexpr size_t kAlignment = 64;

size_t round_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

class CpuCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t size = round_up(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use += static_cast<int64_t>(size);
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
      return p;
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) {
      stats_.bytes_in_use -= static_cast<int64_t>(size);
      LOOM_FAIL("out of memory: could not allocate ", size, " bytes on cpu");
    }
    ++stats_.system_allocations;
    stats_.bytes_reserved += static_cast<int64_t>(size);
    return p;
  }

  void deallocate(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    size_t size = round_up(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= static_cast<int64_t>(size);
    free_[size].push_back(ptr);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void release_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        std::free(p);
        stats_.bytes_reserved -= static_cast<int64_t>(size);
      }
      blocks.clear();
    }
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

Allocator& allocator_for(Device device) {
  // A GPU's caching allocator (core/caching_allocator.h) lives with its context in the CUDA backend.
  if (device.is_cuda()) return hooks::device_allocator(device);
  // Leaked on purpose: tensors held in static objects may be freed after main returns.
  static auto* cpu = new CpuCachingAllocator();
  return *cpu;
}

Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(bytes);
}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> keep_alive)
    : data_(data), bytes_(bytes), device_(device), keep_alive_(std::move(keep_alive)) {}

Storage::~Storage() {
  if (allocator_ != nullptr) allocator_->deallocate(data_, bytes_);
}

}  // namespace loom
