// Device memory, handed out through a caching allocator.
//
// Blocks are 64-byte aligned and kept in per-size free lists when released, so a training step that
// requests the same sizes as the previous one gets every buffer from the cache: after the first step,
// `system_allocations()` stops growing. This is what "a train step allocates nothing after its first
// run" means here, and the test in tests/core checks it. A GPU's allocator (core/caching_allocator.h, with
// segments, splitting and streams) gives the same promise through the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace loom {

struct AllocatorStats {
  int64_t system_allocations = 0;  // blocks obtained from the OS/driver since start
  int64_t cache_hits = 0;          // requests served from the free lists
  int64_t bytes_in_use = 0;
  int64_t bytes_reserved = 0;      // in use + cached
  int64_t peak_bytes_in_use = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Returns cached blocks to the system.
  virtual void release_cache() = 0;
  // Restarts peak_bytes_in_use from the bytes in use now (to measure one phase's peak).
  virtual void reset_peak() = 0;
};

// The allocator for a device (one per device, created on first use).
Allocator& allocator_for(Device device);

// A block of device memory. Tensors share a Storage; views carry an offset into it.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Wraps memory owned elsewhere (e.g. an mmap'd file); `keep_alive` holds the owner.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null for wrapped memory
  std::shared_ptr<void> keep_alive_;
};

}  // namespace loom
