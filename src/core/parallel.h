// Thread parallelism on the CPU (OpenMP underneath).
//
// Determinism: parallel_for splits [begin, end) into chunks that depend only on the range and `grain`,
// never on the thread count, so a kernel whose chunks write disjoint outputs is bitwise reproducible.
// For reductions, reduce each fixed chunk separately and combine the partials in chunk order
// (see parallel_reduce_chunks): the result is then the same whatever the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <omp.h>

namespace loom {

// OpenMP's wait policy when the user chose none. GNU OpenMP's own default spins about 300,000 times at
// every barrier and at the end of every parallel region before it sleeps (milliseconds): right when the
// cores are loom's alone, but on a CPU shared with other processes a spinning thread burns the time
// slice its lagging teammate needs. The default `loom train` model (many short parallel regions) ran
// 3.7x slower beside one busy process with it, 1.8x with a spin count of 10,000 (tens of microseconds),
// which costs ~2% when the cores are free (bench/contention.sh, docs/contention.md).
inline constexpr const char* kDefaultSpinCount = "10000";

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets GOMP_SPINCOUNT=kDefaultSpinCount in this
// process's environment and returns true; otherwise changes nothing (the user's choice stands). GNU
// OpenMP reads its environment once, when it is loaded, so the setting reaches only a process started
// afterwards: the CLI runs itself again (cli/main.cpp); the Python package sets it before it loads the
// library.
bool set_default_wait_policy_env();

// Number of threads kernels use. Defaults to OMP_NUM_THREADS / the core count.
int num_threads();
void set_num_threads(int n);  // n in [1, kMaxThreads] (core/thread_count.h)

// Calls fn(chunk_begin, chunk_end) over [begin, end) in chunks of about `grain` items.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || omp_in_parallel() || num_threads() == 1) {
    fn(begin, end);
    return;
  }
  // Chunks are handed out one at a time (dynamic), not in fixed halves: uneven chunks (causal attention
  // heads) balance, and when another process takes a core for a time slice the thread still running
  // takes over the chunks of the one that is not. Which thread runs a chunk never changes its result.
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = begin + c * grain;
    fn(b, std::min(end, b + grain));
  }
}

// Fixed-chunk reduction: partial[c] = fn(chunk c) computed in parallel, then summed in chunk order.
template <typename T, typename Fn>
T parallel_reduce_chunks(int64_t begin, int64_t end, int64_t grain, T init, Fn&& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return init;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  std::vector<T> partial(static_cast<size_t>(chunks), T{});
  parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t b = begin + c * grain;
      partial[static_cast<size_t>(c)] = fn(b, std::min(end, b + grain));
    }
  });
  T total = init;
  for (const T& p : partial) total += p;
  return total;
}

}  // namespace loom
