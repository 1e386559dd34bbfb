// Thread parallelism on the CPU (OpenMP underneath).
//
// Determinism: parallel_for splits [begin, end) into chunks that depend only on the range and `grain`,
// never on the thread count, so a kernel whose chunks write disjoint outputs is bitwise reproducible.
// For reductions, reduce each fixed chunk separately and combine the partials in chunk order
// (see parallel_reduce_chunks): the result is then the same whatever the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
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
// A `--threads`-style request checked to be in [0, kMaxThreads]; 0 (the default) means num_threads().
// `what` names the argument in the error: "bench train: threads".
int threads_or_default(int64_t requested, const char* what);

// Parallel regions started so far by parallel_for and parallel_team, process-wide: how a caller (a
// benchmark, a test) sees what one step of its work costs in fork/join. Counting costs one relaxed
// atomic increment per region.
int64_t parallel_regions();
namespace detail {
extern std::atomic<int64_t> g_parallel_regions;
}

namespace detail {
// One thread's claim counter in parallel_for, on its own cache line.
struct alignas(64) ChunkCounter {
  std::atomic<int64_t> claimed{0};
};
}  // namespace detail

// Calls fn(chunk_begin, chunk_end) over [begin, end) in chunks of about `grain` items.
//
// Which thread runs a chunk: thread t of n owns the contiguous chunks [chunks·t/n, chunks·(t+1)/n) and
// runs them first, in order; a thread done with its own takes the unclaimed chunks of the others (one
// at a time, from a shared counter per owner). Owning a fixed share keeps an op's rows on the core
// that wrote them in the op before (the same rows fall to the same thread in every op over the same
// rows): with chunks handed out one at a time to whichever thread asked, about half of every input came
// from the other core's cache, and on small models (the tiny preset, [1024, 64] activations that fit
// in a core's L2) the memory-bound ops ran slower on 2 threads than on 1 (docs/mesh.md, "One process
// against ranks"). Taking over the others' chunks keeps what the one-at-a-time handout gave: uneven
// chunks (causal attention heads) balance, and when another process takes a core for a time slice the
// thread still running does the chunks of the one that is not. Which thread runs a chunk never changes
// its result.
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
  detail::g_parallel_regions.fetch_add(1, std::memory_order_relaxed);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), chunks));
  constexpr int kInline = 8;
  detail::ChunkCounter inline_counters[kInline];
  std::vector<detail::ChunkCounter> more(threads > kInline ? static_cast<size_t>(threads) : 0);
  detail::ChunkCounter* counters = threads > kInline ? more.data() : inline_counters;
  auto run_chunk = [&](int64_t c) {
    const int64_t b = begin + c * grain;
    fn(b, std::min(end, b + grain));
  };
#pragma omp parallel num_threads(threads)
  {
    // OpenMP may start fewer threads than asked (OMP_THREAD_LIMIT): the shares are those of the real
    // team, whose members all see the same size.
    const int size = omp_get_num_threads(), me = omp_get_thread_num();
    auto first = [&](int t) { return chunks * t / size; };
    for (int k = 0; k < size; ++k) {  // own share first, then the others', the next owner first
      const int t = (me + k) % size;
      const int64_t lo = first(t), count = first(t + 1) - lo;
      std::atomic<int64_t>& claimed = counters[t].claimed;
      // A share seen exhausted is left without a claim, so that its counter's line stays with its owner.
      while (claimed.load(std::memory_order_relaxed) < count) {
        const int64_t i = claimed.fetch_add(1, std::memory_order_relaxed);
        if (i >= count) break;
        run_chunk(lo + i);
      }
    }
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

// ---- a team of threads that stays together across phases -----------------------------------------
//
// parallel_for forks and joins a team per call. A computation made of many small dependent steps (one
// decode step of a small model: ~150 matmuls, norms and attentions of a few microseconds each) spends
// more in those forks and joins than in its work, and far more when OpenMP's threads sleep between
// regions (OMP_WAIT_POLICY=passive) or the machine is busy. parallel_team forks once and runs fn on
// every thread of the team; the steps are separated by team.barrier(), which spins for a bounded time
// (kSpinMicros, offering its core to other ready threads as it spins) and then sleeps on a futex, so a
// waiting thread neither burns a core indefinitely on a loaded machine nor pays a kernel wake-up for the
// short waits of a balanced step.

class TeamBarrier {
 public:
  // How long a thread that reaches the barrier early spins before it sleeps. Longer than the imbalance
  // of a balanced step (a few microseconds), far shorter than a scheduler time slice.
  static constexpr int64_t kSpinMicros = 50;
  // Returns when `team_size` threads (the same number on every call) have called it.
  void arrive_and_wait(int team_size);

 private:
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<int> sleepers_{0};
};

class Team {
 public:
  Team(int rank, int size, TeamBarrier* barrier) : rank_(rank), size_(size), barrier_(barrier) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Every thread of the team must call it the same number of times.
  void barrier() {
    if (size_ > 1) barrier_->arrive_and_wait(size_);
  }
  // This thread's part of [0, n): size() contiguous parts of ceil(n / size()) rounded up to a multiple
  // of `align` (the last parts may be shorter or empty). Depends only on n, align and size().
  std::pair<int64_t, int64_t> share(int64_t n, int64_t align = 1) const {
    const int64_t per = ((n + size_ - 1) / size_ + align - 1) / align * align;
    return {std::min<int64_t>(n, rank_ * per), std::min<int64_t>(n, (rank_ + 1) * per)};
  }

 private:
  int rank_, size_;
  TeamBarrier* barrier_;
};

// Work in phases whose chunks any thread of a team may claim: for a team that must keep going when the
// OS deschedules one of its threads (a busy machine). With fixed shares and a barrier, a thread that
// is not running stalls every phase; here the threads claim phase p's chunks and wait until all of them
// are done, so a thread that is not running holds up only a chunk it has claimed.
//
// Each thread first takes the chunks of a home range of its own, in order from the front, and then
// takes what is left of the others' ranges from their backs (parallel_for's shares, above, for a team
// that stays together). So a thread's chunks are contiguous, a run of a matrix's rows read in order
// that the hardware prefetchers follow across chunks, where one counter for all handed the chunks out
// alternately: a 16-token int8x2 matmul of [12288, 576] in 64-row chunks took 0.41-0.44 ms on 2
// threads so, 0.34-0.36 ms in two contiguous halves (Intel Xeon with AMX; docs/serve.md); and the
// owner's run stays whole while another thread helps with its end.
// The results must not depend on which thread runs a chunk (each chunk writes outputs of its own,
// computed the same way by any thread).
class ClaimedPhases {
 public:
  // `ranges`: the home ranges a phase's chunks are split into, the team's size (a thread of rank r >=
  // ranges has no home range and only helps; a range whose thread never comes is taken by the others).
  ClaimedPhases(int64_t phases, int ranges)
      : ranges_(std::max(ranges, 1)),
        lines_per_range_((phases + kPerLine - 1) / kPerLine),
        claims_(static_cast<size_t>(ranges_ * lines_per_range_)),
        done_(static_cast<size_t>(phases)) {}
  // Phase p: prepare() once if this thread claims a chunk, then chunk(c) for each c in [0, chunks) it
  // claims; returns when every chunk of p is done. Every thread calls it for p = 0, 1, ... in order,
  // with the same `chunks`, and its own rank.
  template <class Prepare, class Chunk>
  void run(int64_t p, int64_t chunks, int rank, Prepare&& prepare, Chunk&& chunk) {
    std::atomic<int64_t>& done = done_[static_cast<size_t>(p)];
    int64_t mine = 0;
    // Range r's chunks, taken from the front (the owner) or the back (the others) while any are left.
    auto take = [&](int r, bool front) {
      const int64_t begin = chunks * r / ranges_, size = chunks * (r + 1) / ranges_ - begin;
      std::atomic<int64_t>& claims = claims_[static_cast<size_t>(r * lines_per_range_ + p / kPerLine)].count[p % kPerLine];
      // One atomic word, front claims in the low 32 bits and back claims in the high: each claim sees
      // both, so the first `size` claims of a range get its chunks, each once, and the rest nothing. A
      // range seen exhausted is left without a claim, so that its line stays with its owner.
      auto exhausted = [size](int64_t seen) { return (seen & 0xffffffff) + (seen >> 32) >= size; };
      while (!exhausted(claims.load(std::memory_order_relaxed))) {
        const int64_t seen = claims.fetch_add(front ? 1 : int64_t{1} << 32, std::memory_order_relaxed);
        if (exhausted(seen)) return;
        const int64_t taken_front = seen & 0xffffffff, taken_back = seen >> 32;
        if (mine++ == 0) prepare();
        chunk(front ? begin + taken_front : begin + size - 1 - taken_back);
      }
    };
    if (rank < ranges_) take(rank, true);
    for (int i = 1; i <= ranges_; ++i) {
      const int r = (rank + i) % ranges_;
      if (r != rank) take(r, false);
    }
    // This thread's chunks counted once, when it has no more to claim (a count per chunk bounced the
    // counter's line between the cores at every chunk: 5% of a 16-row decode step on 2 threads). The
    // last count wakes the threads asleep in wait_done (sleepers_ is read after done is bumped, and a
    // sleeper counts itself before it reads done: one of the two sees the other).
    if (mine > 0 && done.fetch_add(mine, std::memory_order_seq_cst) + mine == chunks &&
        sleepers_.load(std::memory_order_seq_cst) > 0) {
      done.notify_all();
    }
    wait_done(done, chunks);
  }

 private:
  // Spins for up to TeamBarrier::kSpinMicros (yielding the core to other ready threads as it spins),
  // then sleeps until the last chunk is done (a thread that waits for a descheduled one leaves the core
  // to it and to the others).
  void wait_done(std::atomic<int64_t>& done, int64_t chunks);
  // Range r's claim counters of all phases, on lines of their own: two owners' claims never share a
  // line, and the memory grows with the phases and ranges, not their product times a line.
  static constexpr int64_t kPerLine = 8;
  struct alignas(64) Counters {
    std::atomic<int64_t> count[kPerLine] = {};
  };
  int ranges_;
  int64_t lines_per_range_;
  std::vector<Counters> claims_;
  std::vector<std::atomic<int64_t>> done_;
  std::atomic<int> sleepers_{0};
};

// Runs fn(team) once on each of `threads` threads (num_threads() when 0) in one parallel region; on the
// calling thread alone when threads is 1 or when called inside a parallel region. fn must not throw (an
// exception cannot leave an OpenMP region): check everything before.
template <typename Fn>
void parallel_team(int threads, Fn&& fn) {
  if (threads <= 0) threads = num_threads();
  if (threads == 1 || omp_in_parallel()) {
    Team solo(0, 1, nullptr);
    fn(solo);
    return;
  }
  detail::g_parallel_regions.fetch_add(1, std::memory_order_relaxed);
  TeamBarrier barrier;
#pragma omp parallel num_threads(threads)
  {
    // OpenMP may start fewer threads than asked (OMP_THREAD_LIMIT): every member sees the real size.
    Team team(omp_get_thread_num(), omp_get_num_threads(), &barrier);
    fn(team);
  }
}

}  // namespace loom
