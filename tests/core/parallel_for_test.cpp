// core/parallel.h's parallel_for: each thread runs its own share of the chunks first and then takes
// over the others' unclaimed ones. Whatever the thread count (1, 2, 3 and 9 threads: more threads than
// this 2-core machine's cores, and more than the inline counters), every chunk runs exactly once, with
// the bounds the grain gives (so the results of a kernel whose chunks write disjoint outputs cannot
// depend on the thread count), a thread stealing from a share that is running still leaves each of
// its chunks to one thread only, and parallel_reduce_chunks sums the same partials in the same order.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/parallel.h"

using namespace loom;

namespace {

struct SavedThreads {
  int saved = num_threads();
  ~SavedThreads() { set_num_threads(saved); }
};

}  // namespace

TEST(ParallelFor, EveryChunkOnceWithTheGrainsBoundsOnAnyThreadCount) {
  SavedThreads restore;
  for (int threads : {1, 2, 3, 9}) {
    set_num_threads(threads);
    for (int64_t n : {1, 2, 7, 64, 1000, 1025}) {
      for (int64_t grain : {1, 3, 16, 4096}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + ", n " + std::to_string(n) + ", grain " +
                     std::to_string(grain));
        const int64_t begin = 5, end = begin + n, chunks = (n + grain - 1) / grain;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> calls = 0;
        std::atomic<bool> bad_bounds = false;
        parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
          calls.fetch_add(1);
          // One chunk per call, starting on the grain, unless the whole range runs in one call.
          const bool whole = b == begin && e == end;
          if (!whole && ((b - begin) % grain != 0 || e != std::min(end, b + grain))) bad_bounds = true;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i - begin)].fetch_add(1);
        });
        EXPECT_FALSE(bad_bounds.load());
        if (threads > 1) {
          EXPECT_EQ(calls.load(), chunks);
        }
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "item " << i;
      }
    }
  }
}

TEST(ParallelFor, UnevenChunksAreTakenOverAndStillRunOnce) {
  // The first share's chunks are slow: the other threads finish theirs and take the rest of it.
  SavedThreads restore;
  for (int threads : {2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_num_threads(threads);
    constexpr int64_t kChunks = 24;
    std::vector<std::atomic<int>> runs(kChunks);
    parallel_for(0, kChunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        runs[static_cast<size_t>(c)].fetch_add(1);
        if (c < kChunks / threads) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    for (int64_t c = 0; c < kChunks; ++c) EXPECT_EQ(runs[static_cast<size_t>(c)].load(), 1) << "chunk " << c;
  }
}

TEST(ParallelFor, ReduceChunksIsTheSameSumOnAnyThreadCount) {
  SavedThreads restore;
  std::vector<float> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / static_cast<float>(i + 1) * ((i % 3) ? 1.0f : -1.0f);
  auto sum = [&] {
    return parallel_reduce_chunks<float>(0, static_cast<int64_t>(x.size()), 1000, 0.0f, [&](int64_t b, int64_t e) {
      float s = 0;
      for (int64_t i = b; i < e; ++i) s += x[static_cast<size_t>(i)];
      return s;
    });
  };
  set_num_threads(1);
  const float one = sum();
  for (int threads : {2, 3, 9}) {
    set_num_threads(threads);
    EXPECT_EQ(sum(), one) << threads << " threads";  // bitwise: the same partials, added in chunk order
  }
}
