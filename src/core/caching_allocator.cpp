#include "core/caching_allocator.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace loom {

struct CachingAllocator::Block {
  enum class State { Allocated, Pending, Free };
  uintptr_t ptr = 0;
  size_t size = 0;            // rounded, as counted in the stats
  StreamId stream = 0;        // the stream it belongs to (its segment's)
  PoolId pool = 0;            // its segment's pool
  bool small = false;         // from a small segment
  State state = State::Free;
  Block* prev = nullptr;      // neighbours in the same segment, by address
  Block* next = nullptr;
  std::vector<StreamId> other_streams;  // record_stream() while allocated
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::tie(a->pool, a->stream, a->size, a->ptr) < std::tie(b->pool, b->stream, b->size, b->ptr);
}

namespace {
std::string mib(int64_t bytes) {
  return str(bytes / (1 << 20), ".", (bytes % (1 << 20)) * 10 / (1 << 20), " MiB");
}
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend)
    : backend_(std::move(backend)), device_name_(backend_->device_name()) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Pending& p : pending_) {
    for (EventId e : p.events) backend_->destroy_event(e);
  }
  for (Block* head : segments_) {
    backend_->raw_free(reinterpret_cast<void*>(head->ptr));
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

size_t CachingAllocator::rounded_size(size_t bytes) const {
  if (bytes < kMinBlock) return kMinBlock;
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

CachingAllocator::FreeSet& CachingAllocator::free_set(const Block* block) {
  return block->small ? small_free_ : large_free_;
}

CachingAllocator::Block* CachingAllocator::find_free(FreeSet& set, size_t size, StreamId stream, PoolId pool) {
  Block key;
  key.pool = pool;
  key.stream = stream;
  key.size = size;
  key.ptr = 0;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->pool != pool || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  set.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, size_t segment_size, StreamId stream,
                                                       PoolId pool, bool small) {
  if (!no_new_memory_.empty()) {
    LOOM_FAIL(no_new_memory_, ": a request for ", size, " bytes on ", device_name_,
              " needs new device memory, and none may be taken here (only cached blocks); ",
              describe_locked());
  }
  void* raw = backend_->raw_allocate(segment_size);
  if (raw == nullptr) {
    // Out of memory: give back what the cache holds whole, then try once more.
    ++stats_.oom_retries;
    release_free_segments();
    raw = backend_->raw_allocate(segment_size);
  }
  if (raw == nullptr) {
    LOOM_FAIL("out of memory on ", device_name_, ": asked for ", size, " bytes (a ", mib(segment_size),
              " segment); ", describe_locked());
  }
  auto* block = new Block;
  block->ptr = reinterpret_cast<uintptr_t>(raw);
  block->size = segment_size;
  block->stream = stream;
  block->pool = pool;
  block->small = small;
  segments_.push_back(block);
  ++stats_.segments;
  ++stats_.raw_allocations;
  stats_.reserved_bytes += static_cast<int64_t>(segment_size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return block;
}

void* CachingAllocator::allocate(size_t bytes, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  const size_t size = rounded_size(bytes);
  const bool small = size <= kSmallRequest;
  FreeSet& set = small ? small_free_ : large_free_;
  Block* block = find_free(set, size, stream, current_pool_);
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    size_t segment = small ? kSmallSegment
                           : size < kMidRequest ? kLargeSegment
                                                : (size + kSegmentRounding - 1) / kSegmentRounding * kSegmentRounding;
    block = new_segment(size, segment, stream, current_pool_, small);
  }
  // Split off the rest when it is worth keeping.
  const size_t rest = block->size - size;
  if (small ? rest >= kMinBlock : rest > kSmallRequest) {
    auto* tail = new Block;
    tail->ptr = block->ptr + size;
    tail->size = rest;
    tail->stream = block->stream;
    tail->pool = block->pool;
    tail->small = block->small;
    tail->prev = block;
    tail->next = block->next;
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    set.insert(tail);
  }
  block->state = Block::State::Allocated;
  allocated_[block->ptr] = block;
  ++stats_.allocations;
  stats_.allocated_bytes += static_cast<int64_t>(block->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return reinterpret_cast<void*>(block->ptr);
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  LOOM_CHECK(it != allocated_.end(), "free on ", device_name_, ": pointer ", ptr,
             " was not handed out by this allocator (or was freed already)");
  Block* block = it->second;
  allocated_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(block->size);
  if (block->other_streams.empty()) {
    free_block(block);
    return;
  }
  // Work queued on other streams may still read or write it: wait for an event on each.
  Pending pending{block, {}};
  for (StreamId s : block->other_streams) pending.events.push_back(backend_->record_event(s));
  block->other_streams.clear();
  block->state = Block::State::Pending;
  pending_.push_back(std::move(pending));
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  LOOM_CHECK(it != allocated_.end(), "record_stream on ", device_name_, ": pointer ", ptr,
             " is not an allocated block of this allocator");
  Block* block = it->second;
  if (stream == block->stream) return;
  if (std::find(block->other_streams.begin(), block->other_streams.end(), stream) == block->other_streams.end()) {
    block->other_streams.push_back(stream);
  }
}

void CachingAllocator::process_events() {
  auto done = [&](Pending& p) {
    for (EventId e : p.events) {
      if (!backend_->event_done(e)) return false;
    }
    for (EventId e : p.events) backend_->destroy_event(e);
    free_block(p.block);
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

void CachingAllocator::free_block(Block* block) {
  block->state = Block::State::Free;
  FreeSet& set = free_set(block);
  // Merge with free neighbours (same segment, hence same stream and pool); the lower block survives,
  // so a segment's head block is never deleted while the segment lives.
  if (Block* next = block->next; next != nullptr && next->state == Block::State::Free) {
    set.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev != nullptr && prev->state == Block::State::Free) {
    set.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  set.insert(block);
}

void CachingAllocator::release_free_segments() {
  std::vector<Block*> kept;
  for (Block* head : segments_) {
    const bool whole_and_free = head->state == Block::State::Free && head->next == nullptr;
    if (!whole_and_free || head->pool != 0) {  // a private pool keeps its memory until released
      kept.push_back(head);
      continue;
    }
    free_set(head).erase(head);
    backend_->raw_free(reinterpret_cast<void*>(head->ptr));
    stats_.reserved_bytes -= static_cast<int64_t>(head->size);
    --stats_.segments;
    ++stats_.raw_frees;
    delete head;
  }
  segments_ = std::move(kept);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  release_free_segments();
}

size_t CachingAllocator::allocated_size(void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  LOOM_CHECK(it != allocated_.end(), "allocated_size on ", device_name_, ": pointer ", ptr,
             " is not an allocated block of this allocator");
  return it->second->size;
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::begin_pool(PoolId pool) {
  LOOM_CHECK(pool != 0, "begin_pool on ", device_name_, ": pool 0 is the default pool; private pools are > 0");
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(current_pool_ == 0, "begin_pool(", pool, ") on ", device_name_, ": pool ", current_pool_,
             " is still active (pools do not nest)");
  current_pool_ = pool;
}

void CachingAllocator::end_pool() {
  std::lock_guard<std::mutex> lock(mutex_);
  current_pool_ = 0;
}

void CachingAllocator::release_pool(PoolId pool) {
  LOOM_CHECK(pool != 0, "release_pool on ", device_name_, ": pool 0 cannot be released");
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(current_pool_ != pool, "release_pool(", pool, ") on ", device_name_, ": the pool is active");
  // Re-key every block of the pool's segments (free ones move between positions in their set).
  for (Block* head : segments_) {
    if (head->pool != pool) continue;
    for (Block* b = head; b != nullptr; b = b->next) {
      if (b->state == Block::State::Free) {
        FreeSet& set = free_set(b);
        set.erase(b);
        b->pool = 0;
        set.insert(b);
      } else {
        b->pool = 0;
      }
    }
  }
}

std::string CachingAllocator::describe_locked() const {
  return str(device_name_, " has ", mib(stats_.allocated_bytes), " allocated and ", mib(stats_.reserved_bytes),
             " reserved in ", stats_.segments, " segments (peak allocated ", mib(stats_.peak_allocated_bytes), ")");
}

CachingAllocator::NoNewMemoryGuard::NoNewMemoryGuard(CachingAllocator& allocator, std::string what)
    : allocator_(allocator) {
  LOOM_CHECK(!what.empty(), "NoNewMemoryGuard: name what it guards");
  std::lock_guard<std::mutex> lock(allocator_.mutex_);
  previous_ = allocator_.no_new_memory_;
  allocator_.no_new_memory_ = std::move(what);
}

CachingAllocator::NoNewMemoryGuard::~NoNewMemoryGuard() {
  std::lock_guard<std::mutex> lock(allocator_.mutex_);
  allocator_.no_new_memory_ = previous_;
}

}  // namespace loom
