// core/parallel.h's ClaimedPhases: every chunk of every phase runs exactly once, a phase starts only
// after the one before it has finished (each chunk reads what another chunk wrote in the phase before),
// and a thread prepares a phase at most once. On 1, 2 and 3 threads (3 on a 2-core machine: threads that
// are not always running).
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/parallel.h"

using namespace loom;

TEST(ClaimedPhases, EveryChunkOnceAndPhasesInOrder) {
  constexpr int64_t kPhases = 40, kChunks = 13;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_num_threads(threads);
    // value[p][c] = value[p - 1][(c + 1) % kChunks] + 1: read from the previous phase, written once.
    std::vector<std::vector<int64_t>> value(kPhases, std::vector<int64_t>(kChunks, -1));
    std::vector<std::atomic<int>> runs(static_cast<size_t>(kPhases * kChunks));
    std::atomic<int> prepared = 0;
    ClaimedPhases phases(kPhases, threads);
    parallel_team(threads, [&](Team& team) {
      for (int64_t p = 0; p < kPhases; ++p) {
        phases.run(
            p, kChunks, team.rank(), [&] { prepared.fetch_add(1); },
            [&](int64_t c) {
              runs[static_cast<size_t>(p * kChunks + c)].fetch_add(1);
              value[p][c] = p == 0 ? 0 : value[p - 1][(c + 1) % kChunks] + 1;
            });
      }
    });
    for (int64_t p = 0; p < kPhases; ++p) {
      for (int64_t c = 0; c < kChunks; ++c) {
        EXPECT_EQ(runs[static_cast<size_t>(p * kChunks + c)].load(), 1) << "phase " << p << ", chunk " << c;
        EXPECT_EQ(value[p][c], p) << "phase " << p << ", chunk " << c;
      }
    }
    EXPECT_GE(prepared.load(), kPhases);               // at least one thread prepared each phase
    EXPECT_LE(prepared.load(), kPhases * threads);     // and never more than once per thread
  }
  set_num_threads(saved);
}

// Home ranges that do not match the team: a range whose thread never comes (more ranges than threads)
// is taken by the others, a thread without a range (fewer ranges) only helps; phases of 0, 1 and fewer
// chunks than ranges too. Every chunk still runs exactly once.
TEST(ClaimedPhases, EveryChunkOnceWhateverTheRangesAndChunks) {
  const int64_t chunk_counts[] = {13, 0, 1, 2, 7, 64};
  constexpr int64_t kPhases = 30;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    for (int ranges : {1, 2, 5}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", ranges " + std::to_string(ranges));
      set_num_threads(threads);
      std::vector<std::atomic<int>> runs(static_cast<size_t>(kPhases * 64));
      ClaimedPhases phases(kPhases, ranges);
      parallel_team(threads, [&](Team& team) {
        for (int64_t p = 0; p < kPhases; ++p) {
          phases.run(p, chunk_counts[p % 6], team.rank(), [] {}, [&](int64_t c) { runs[static_cast<size_t>(p * 64 + c)].fetch_add(1); });
        }
      });
      for (int64_t p = 0; p < kPhases; ++p) {
        for (int64_t c = 0; c < 64; ++c) {
          EXPECT_EQ(runs[static_cast<size_t>(p * 64 + c)].load(), c < chunk_counts[p % 6] ? 1 : 0) << "phase " << p << ", chunk " << c;
        }
      }
    }
  }
  set_num_threads(saved);
}
