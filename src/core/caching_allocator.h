// A caching allocator for device memory (the CUDA backend's), with its logic apart from the raw calls.
//
// Taking memory from a GPU driver (cudaMalloc/cudaFree) is slow and synchronises the device, so memory
// is taken in segments and kept: freed blocks go to free lists and serve later requests, splitting a
// larger free block when needed and merging neighbours when they are freed. The raw memory and the
// stream events come from a DeviceMemoryBackend, so this file has no CUDA in it and its tests run on the
// CPU with a fake backend (tests/core/caching_allocator_test.cpp); src/backends/cuda/runtime.cpp gives
// the real one.
//
// Conventions:
//   * Sizes are rounded up to 512 bytes. Requests up to 1 MiB ("small") are carved from 2 MiB
//     segments; larger ones from 20 MiB segments when under 10 MiB, else from a segment of their own size
//     rounded up to 2 MiB. A split leaves a remainder only when it is worth keeping (>= 512 bytes among
//     small blocks, > 1 MiB among large ones), so large segments do not fray into slivers.
//   * Stream-aware: a block belongs to the stream it was allocated on, and only requests on that stream
//     reuse it. Work on that stream is ordered, so reuse needs no synchronisation. A block also used on
//     other streams (record_stream) returns to the free lists only once events recorded at its free on
//     those streams have completed.
//   * Pools: normally everything is in pool 0. While a CUDA graph is captured, allocations come from a
//     private pool (begin_pool), whose blocks only that pool reuses: a replayed graph writes to the
//     addresses it was captured with, so nothing else may be handed them until release_pool.
//   * stats().raw_allocations counts segments ever taken from the backend: a training step that takes
//     none after its first run ("no allocation after the first step") leaves it unchanged, and
//     NoNewMemoryGuard turns any new one into an error (what graph capture relies on).
//   * Out of memory: the allocator first returns its wholly free segments to the backend and retries;
//     then it throws a loom::Error naming the device, the size asked for, and what it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

using StreamId = uintptr_t;  // an opaque stream handle (a cudaStream_t's value)
using EventId = uintptr_t;   // an opaque event handle
using PoolId = uint64_t;     // 0: the default pool

// Raw memory and events of one device.
class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  // `bytes` of device memory, or nullptr when the device is out of memory (the allocator then frees its
  // cache and retries). Other failures throw.
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // An event recorded now on `stream`; event_done says whether the work queued before it has finished.
  virtual EventId record_event(StreamId stream) = 0;
  virtual bool event_done(EventId event) = 0;
  virtual void destroy_event(EventId event) = 0;
  virtual std::string device_name() const = 0;  // "cuda:0", for messages
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;       // handed out now (rounded sizes)
  int64_t peak_allocated_bytes = 0;  // since start or reset_peak()
  int64_t reserved_bytes = 0;        // held from the backend now (allocated + cached)
  int64_t peak_reserved_bytes = 0;
  int64_t segments = 0;              // raw allocations held now
  int64_t raw_allocations = 0;       // raw allocations ever made: steady steps leave this unchanged
  int64_t raw_frees = 0;
  int64_t allocations = 0;           // requests served
  int64_t cache_hits = 0;            // requests served without a raw allocation
  int64_t oom_retries = 0;           // times the cache was freed to retry a failed raw allocation
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallRequest = 1 << 20;       // <= this: from small segments
  static constexpr size_t kSmallSegment = 2 << 20;
  static constexpr size_t kLargeSegment = 20 << 20;      // for requests under kMidRequest
  static constexpr size_t kMidRequest = 10 << 20;
  static constexpr size_t kSegmentRounding = 2 << 20;    // requests >= kMidRequest round to this

  explicit CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend);
  // Returns every segment to the backend (blocks still handed out are a bug of the caller; they are
  // freed too, so a test's fake backend sees no leak).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` (0 is allowed and gets a minimal block) for use on `stream`.
  void* allocate(size_t bytes, StreamId stream);
  // Frees a pointer that allocate() returned; anything else is an error naming the pointer.
  void free(void* ptr);
  // Notes that `ptr` is also used by work on `stream`: at free, its memory waits for that work.
  void record_stream(void* ptr, StreamId stream);
  // Returns every wholly free segment of pool 0 (and of released pools) to the backend.
  void empty_cache();

  // The size of the block handed out for `ptr`, as counted in allocated_bytes: the request rounded up,
  // or more when the rest of the free block was too small to keep apart.
  size_t allocated_size(void* ptr) const;

  CachingAllocatorStats stats() const;
  void reset_peak();
  size_t rounded_size(size_t bytes) const;
  const std::string& device_name() const { return device_name_; }

  // From now on (on this allocator) requests are served from private pool `pool` (> 0), until
  // end_pool(). Frees return blocks to the pool they came from whatever the current pool is.
  void begin_pool(PoolId pool);
  void end_pool();
  // Gives a private pool's memory back to pool 0 (when its graph is destroyed).
  void release_pool(PoolId pool);

  // While one is alive, a request that would need a raw allocation throws instead (naming `what`):
  // cached blocks only. Used around graph capture and by tests of "no allocation after the first step".
  class NoNewMemoryGuard {
   public:
    NoNewMemoryGuard(CachingAllocator& allocator, std::string what);
    ~NoNewMemoryGuard();
    NoNewMemoryGuard(const NoNewMemoryGuard&) = delete;
    NoNewMemoryGuard& operator=(const NoNewMemoryGuard&) = delete;

   private:
    CachingAllocator& allocator_;
    std::string previous_;
  };

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockLess>;

  void process_events();
  Block* find_free(FreeSet& set, size_t size, StreamId stream, PoolId pool);
  Block* new_segment(size_t size, size_t segment_size, StreamId stream, PoolId pool, bool small);
  void release_free_segments();
  void free_block(Block* block);
  FreeSet& free_set(const Block* block);
  std::string describe_locked() const;

  std::unique_ptr<DeviceMemoryBackend> backend_;
  std::string device_name_;
  mutable std::mutex mutex_;
  FreeSet small_free_, large_free_;
  std::unordered_map<uintptr_t, Block*> allocated_;   // by address
  std::vector<Block*> segments_;                      // segment heads (the first block of each)
  struct Pending {
    Block* block;
    std::vector<EventId> events;
  };
  std::vector<Pending> pending_;                      // freed blocks waiting for other streams' work
  PoolId current_pool_ = 0;
  std::string no_new_memory_;                         // non-empty while a NoNewMemoryGuard is alive
  CachingAllocatorStats stats_;
};

}  // namespace loom
