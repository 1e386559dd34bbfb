// The GPU caching allocator's logic (core/caching_allocator.h) on a fake device: addresses are numbers
// handed out by the fake, never dereferenced, so tests can "allocate" gigabytes; events complete when a
// test says the stream's work is done.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/caching_allocator.h"
#include "core/error.h"

using namespace loom;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr StreamId kStreamA = 0xA, kStreamB = 0xB;

// The fake's state outlives the allocator that owns the fake, so tests can check for leaks after it.
struct FakeDevice {
  size_t capacity = size_t(1) << 40;
  size_t in_use = 0;
  uintptr_t next_address = 1ull << 32;
  std::map<uintptr_t, size_t> live;        // raw allocations: address -> bytes
  int64_t raw_allocations = 0, failed_allocations = 0;
  std::map<EventId, StreamId> events;      // live events -> stream
  std::set<StreamId> busy;                 // streams whose queued work is not done
  EventId next_event = 1;
  std::map<EventId, bool> done_at_record;  // an event recorded while its stream was idle is done
};

class FakeBackend final : public DeviceMemoryBackend {
 public:
  explicit FakeBackend(FakeDevice& d) : d_(d) {}
  void* raw_allocate(size_t bytes) override {
    if (d_.in_use + bytes > d_.capacity) {
      ++d_.failed_allocations;
      return nullptr;
    }
    const uintptr_t a = d_.next_address;
    d_.next_address += bytes + 4096;  // a gap, so blocks of different segments are never adjacent
    d_.live[a] = bytes;
    d_.in_use += bytes;
    ++d_.raw_allocations;
    return reinterpret_cast<void*>(a);
  }
  void raw_free(void* ptr) override {
    auto it = d_.live.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, d_.live.end()) << "raw_free of an address the fake never gave";
    d_.in_use -= it->second;
    d_.live.erase(it);
  }
  EventId record_event(StreamId stream) override {
    const EventId e = d_.next_event++;
    d_.events[e] = stream;
    d_.done_at_record[e] = d_.busy.count(stream) == 0;
    return e;
  }
  bool event_done(EventId e) override { return d_.done_at_record.at(e) || d_.busy.count(d_.events.at(e)) == 0; }
  void destroy_event(EventId e) override {
    d_.events.erase(e);
    d_.done_at_record.erase(e);
  }
  std::string device_name() const override { return "fake:0"; }

 private:
  FakeDevice& d_;
};

struct Fixture {
  FakeDevice device;
  std::unique_ptr<CachingAllocator> alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeBackend>(device));
};

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

TEST(CachingAllocator, RoundsAndReusesAFreedBlock) {
  Fixture f;
  void* p = f.alloc->allocate(1000, kStreamA);
  EXPECT_EQ(f.alloc->stats().allocated_bytes, 1024);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, int64_t(CachingAllocator::kSmallSegment));
  f.alloc->free(p);
  EXPECT_EQ(f.alloc->stats().allocated_bytes, 0);
  void* q = f.alloc->allocate(900, kStreamA);  // rounds to the same 1024
  EXPECT_EQ(q, p);
  EXPECT_EQ(f.alloc->stats().raw_allocations, 1);
  EXPECT_EQ(f.alloc->stats().cache_hits, 1);
  EXPECT_EQ(f.alloc->rounded_size(0), 512u);
  EXPECT_EQ(f.alloc->rounded_size(513), 1024u);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentWithoutOverlap) {
  Fixture f;
  std::vector<void*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.push_back(f.alloc->allocate(10 * KiB, kStreamA));  // 1000 KiB in all
  EXPECT_EQ(f.device.raw_allocations, 1);
  std::set<uintptr_t> starts;
  for (void* p : ptrs) starts.insert(addr(p));
  ASSERT_EQ(starts.size(), 100u);
  uintptr_t prev_end = 0;
  for (uintptr_t s : starts) {
    EXPECT_GE(s, prev_end);
    prev_end = s + 10 * KiB;
  }
}

TEST(CachingAllocator, SplitsLargeSegmentsAndMergesNeighboursOnFree) {
  Fixture f;
  void* a = f.alloc->allocate(3 * MiB, kStreamA);  // a 20 MiB segment, split
  void* b = f.alloc->allocate(3 * MiB, kStreamA);  // from the remainder
  EXPECT_EQ(f.device.raw_allocations, 1);
  EXPECT_EQ(addr(b), addr(a) + 3 * MiB);
  f.alloc->free(a);
  f.alloc->free(b);
  // Both halves and the remainder merged back into one 20 MiB block: 19 MiB fits without a new segment,
  // at the segment's start.
  void* c = f.alloc->allocate(19 * MiB, kStreamA);
  EXPECT_EQ(c, a);
  EXPECT_EQ(f.device.raw_allocations, 1);
  f.alloc->free(c);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0);
  EXPECT_TRUE(f.device.live.empty());
}

TEST(CachingAllocator, BigRequestsGetASegmentRoundedToTwoMiB) {
  Fixture f;
  void* p = f.alloc->allocate(33 * MiB + 1, kStreamA);
  EXPECT_EQ(f.device.live.begin()->second, 34 * MiB);
  // The rest of the segment (under 1 MiB) is too small to keep apart: the block is the whole segment.
  EXPECT_EQ(f.alloc->stats().allocated_bytes, int64_t(34 * MiB));
  f.alloc->free(p);
  void* q = f.alloc->allocate(25 * MiB, kStreamA);  // the 34 MiB block, split: 9 MiB stay free
  EXPECT_EQ(q, p);
  EXPECT_EQ(f.alloc->stats().allocated_bytes, int64_t(25 * MiB));
  f.alloc->free(q);
}

TEST(CachingAllocator, BlocksStayWithTheirStream) {
  Fixture f;
  void* a = f.alloc->allocate(4 * MiB, kStreamA);
  f.alloc->free(a);
  void* b = f.alloc->allocate(4 * MiB, kStreamB);  // may not take stream A's block
  EXPECT_NE(b, a);
  EXPECT_EQ(f.device.raw_allocations, 2);
  void* c = f.alloc->allocate(4 * MiB, kStreamA);
  EXPECT_EQ(c, a);
  f.alloc->free(b);
  f.alloc->free(c);
}

TEST(CachingAllocator, RecordStreamDelaysReuseUntilThatStreamsWorkIsDone) {
  Fixture f;
  void* p = f.alloc->allocate(4 * MiB, kStreamA);
  f.alloc->record_stream(p, kStreamB);
  f.device.busy.insert(kStreamB);  // stream B still has work reading p
  f.alloc->free(p);
  void* q = f.alloc->allocate(4 * MiB, kStreamA);
  EXPECT_NE(q, p) << "p was reused while stream B could still be using it";
  f.device.busy.erase(kStreamB);
  f.alloc->free(q);
  void* r = f.alloc->allocate(4 * MiB, kStreamA);  // the pending free completes here
  void* s = f.alloc->allocate(4 * MiB, kStreamA);
  EXPECT_TRUE(r == p || s == p);
  f.alloc->free(r);
  f.alloc->free(s);
  EXPECT_TRUE(f.device.events.empty()) << "events not destroyed";
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheRetriesThenNamesTheRequest) {
  Fixture f;
  f.device.capacity = 64 * MiB;
  void* a = f.alloc->allocate(40 * MiB, kStreamA);
  f.alloc->free(a);                                 // cached: 40 MiB held
  void* b = f.alloc->allocate(50 * MiB, kStreamA);  // fits only after the cache is freed
  EXPECT_EQ(f.alloc->stats().oom_retries, 1);
  EXPECT_EQ(f.alloc->stats().raw_frees, 1);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, int64_t(50 * MiB));
  try {
    f.alloc->allocate(30 * MiB, kStreamA);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on fake:0"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(30 * MiB) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("50.0 MiB allocated"), std::string::npos) << m;
  }
  f.alloc->free(b);
}

TEST(CachingAllocator, EmptyCacheReleasesOnlyWhollyFreeSegments) {
  Fixture f;
  void* a = f.alloc->allocate(100 * KiB, kStreamA);
  void* b = f.alloc->allocate(100 * KiB, kStreamA);
  f.alloc->free(a);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->stats().reserved_bytes, int64_t(2 * MiB)) << "a segment still in use was released";
  f.alloc->free(b);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0);
  EXPECT_EQ(f.alloc->stats().segments, 0);
}

TEST(CachingAllocator, PeakAndReset) {
  Fixture f;
  void* a = f.alloc->allocate(5 * MiB, kStreamA);
  void* b = f.alloc->allocate(5 * MiB, kStreamA);
  f.alloc->free(a);
  f.alloc->free(b);
  EXPECT_EQ(f.alloc->stats().peak_allocated_bytes, int64_t(10 * MiB));
  EXPECT_EQ(f.alloc->stats().peak_reserved_bytes, int64_t(20 * MiB));
  f.alloc->reset_peak();
  EXPECT_EQ(f.alloc->stats().peak_allocated_bytes, 0);
}

// The promise graph capture relies on: a step that requests the same sizes every time takes new memory
// in its first run only, and a guard turns a violation into an error naming what it guards.
TEST(CachingAllocator, SteadyStepsTakeNoNewMemoryAfterTheFirst) {
  Fixture f;
  auto step = [&](size_t extra) {
    std::vector<void*> live;
    try {
      for (size_t bytes : {size_t(3 * MiB), size_t(700 * KiB), size_t(12 * MiB), size_t(64), extra}) {
        live.push_back(f.alloc->allocate(bytes, kStreamA));
        if (live.size() == 3) {  // frees mid-step, as activations do
          f.alloc->free(live[1]);
          live[1] = nullptr;
        }
      }
    } catch (...) {
      for (void* p : live) f.alloc->free(p);
      throw;
    }
    for (void* p : live) f.alloc->free(p);
  };
  step(1 * MiB);
  const int64_t after_first = f.alloc->stats().raw_allocations;
  {
    CachingAllocator::NoNewMemoryGuard guard(*f.alloc, "step capture");
    step(1 * MiB);
    step(1 * MiB);
    try {
      step(90 * MiB);  // a new size: needs a new segment
      FAIL() << "expected the guard to refuse new memory";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step capture: a request for"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(f.alloc->stats().raw_allocations, after_first);
  step(90 * MiB);  // allowed again once the guard is gone
  EXPECT_EQ(f.alloc->stats().raw_allocations, after_first + 1);
}

TEST(CachingAllocator, PrivatePoolsKeepTheirBlocksUntilReleased) {
  Fixture f;
  f.alloc->begin_pool(7);
  void* g = f.alloc->allocate(4 * MiB, kStreamA);  // as a captured graph would
  f.alloc->end_pool();
  f.alloc->free(g);
  void* other = f.alloc->allocate(4 * MiB, kStreamA);  // pool 0 must not get the graph's memory
  EXPECT_NE(other, g);
  f.alloc->empty_cache();
  EXPECT_EQ(f.device.live.count(addr(g)), 1u) << "empty_cache released a private pool's segment";
  f.alloc->begin_pool(7);
  void* again = f.alloc->allocate(4 * MiB, kStreamA);  // the pool reuses its own block
  EXPECT_EQ(again, g);
  f.alloc->free(again);
  EXPECT_THROW(f.alloc->begin_pool(8), Error);  // pools do not nest
  f.alloc->end_pool();
  f.alloc->release_pool(7);
  f.alloc->free(other);
  f.alloc->empty_cache();
  EXPECT_TRUE(f.device.live.empty());
  EXPECT_THROW(f.alloc->begin_pool(0), Error);
}

TEST(CachingAllocator, FreeingAForeignOrFreedPointerIsAnError) {
  Fixture f;
  void* p = f.alloc->allocate(100, kStreamA);
  EXPECT_THROW(f.alloc->free(reinterpret_cast<void*>(addr(p) + 512)), Error);
  f.alloc->free(p);
  try {
    f.alloc->free(p);
    FAIL() << "double free accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was not handed out by this allocator"), std::string::npos);
  }
  EXPECT_THROW(f.alloc->record_stream(p, kStreamB), Error);
}

// Random requests of all sizes on two streams: live blocks never overlap, the stats add up, and
// everything returns to the device in the end.
TEST(CachingAllocator, RandomWorkloadKeepsItsInvariants) {
  Fixture f;
  std::mt19937_64 rng(1234);
  std::map<uintptr_t, std::pair<size_t, StreamId>> live;  // address -> (rounded size, stream)
  auto check_no_overlap = [&] {
    uintptr_t end = 0;
    for (auto& [a, info] : live) {
      ASSERT_GE(a, end) << "blocks overlap";
      end = a + info.first;
    }
  };
  const size_t sizes[] = {1, 100, 512, 4000, 100 * KiB, 1 * MiB, 1 * MiB + 1, 3 * MiB, 9 * MiB, 11 * MiB, 40 * MiB};
  for (int i = 0; i < 4000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      const size_t bytes = sizes[rng() % std::size(sizes)] + rng() % 300;
      const StreamId s = rng() % 2 ? kStreamA : kStreamB;
      void* p = f.alloc->allocate(bytes, s);
      ASSERT_EQ(live.count(addr(p)), 0u);
      const size_t size = f.alloc->allocated_size(p);
      // The request rounded up, plus at most a remainder too small to keep apart.
      ASSERT_GE(size, f.alloc->rounded_size(bytes));
      ASSERT_LE(size, f.alloc->rounded_size(bytes) + CachingAllocator::kSmallRequest);
      live[addr(p)] = {size, s};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      f.alloc->free(reinterpret_cast<void*>(it->first));
      live.erase(it);
    }
    if (i % 97 == 0) f.alloc->empty_cache();
    check_no_overlap();
    int64_t sum = 0;
    for (auto& [a, info] : live) sum += static_cast<int64_t>(info.first);
    ASSERT_EQ(f.alloc->stats().allocated_bytes, sum);
    ASSERT_LE(f.alloc->stats().allocated_bytes, f.alloc->stats().reserved_bytes);
    ASSERT_EQ(f.alloc->stats().reserved_bytes, int64_t(f.device.in_use));
  }
  for (auto& [a, info] : live) f.alloc->free(reinterpret_cast<void*>(a));
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0);
  EXPECT_TRUE(f.device.live.empty());
  f.alloc.reset();
  EXPECT_TRUE(f.device.live.empty());
}

TEST(CachingAllocator, DestructionReturnsEverySegment) {
  Fixture f;
  f.alloc->allocate(5 * MiB, kStreamA);  // still handed out: the destructor frees it too
  f.alloc->allocate(10, kStreamB);
  f.alloc.reset();
  EXPECT_TRUE(f.device.live.empty());
}
