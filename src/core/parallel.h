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
#pragma omp parallel for schedule(static) num_threads(num_threads())
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
