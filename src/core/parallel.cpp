#include "core/parallel.h"

#include <chrono>
#include <sched.h>
#include <cstdlib>
#include <string>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/thread_count.h"

namespace loom {
namespace {
int g_threads = 0;  // 0: not set, use OpenMP's default
}

bool set_default_wait_policy_env() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return false;
  return ::setenv("GOMP_SPINCOUNT", kDefaultSpinCount, /*overwrite=*/0) == 0;
}

namespace detail {
std::atomic<int64_t> g_parallel_regions{0};
}

int64_t parallel_regions() { return detail::g_parallel_regions.load(std::memory_order_relaxed); }

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Polls `done` for up to kSpinMicros; true if it turned true. Every 64 polls the waiting thread also
// offers its core to any other thread ready to run there (sched_yield: a system call that returns at
// once when none is): in `loom serve` the HTTP threads and the load's clients share the cores with the
// step's team, and a thread that waits for its teammate's last chunk lets them run now rather than
// preempt the team later in the step (tools/serve_bench.py, SmolLM2 Q4_1 on 2 cores, the server with and
// without it side by side, 22 rounds: 16 clients' tokens/s higher in 16, +4.7% at the median; one
// client's +1%, within the noise).
template <class Done>
bool spin_until(Done&& done) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::microseconds(TeamBarrier::kSpinMicros);
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (Clock::now() > deadline) return false;
      sched_yield();
    }
  }
}
}  // namespace

// A counting barrier with a generation number. The last thread to arrive resets the count and bumps
// the generation; the others watch the generation, spinning for up to kSpinMicros and then sleeping in
// std::atomic::wait (a futex on Linux). The sleeper count lets the last thread skip the wake-up system
// call when nobody sleeps: with both sides sequentially consistent, either the arriving thread sees the
// sleeper's increment, or the sleeper's wait sees the new generation and does not block.
void TeamBarrier::arrive_and_wait(int team_size) {
  const uint32_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == team_size - 1) {
    arrived_.store(0, std::memory_order_relaxed);  // before the new generation releases anyone
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    return;
  }
  if (spin_until([&] { return generation_.load(std::memory_order_acquire) != gen; })) return;
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (generation_.load(std::memory_order_seq_cst) == gen) generation_.wait(gen, std::memory_order_seq_cst);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void ClaimedPhases::wait_done(std::atomic<int64_t>& done, int64_t chunks) {
  if (spin_until([&] { return done.load(std::memory_order_acquire) >= chunks; })) return;
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  for (int64_t d; (d = done.load(std::memory_order_seq_cst)) < chunks;) done.wait(d, std::memory_order_seq_cst);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void set_num_threads(int n) {
  LOOM_CHECK(n >= 1 && n <= kMaxThreads, "thread count must be in [1, ", kMaxThreads, "], got ", n);
  g_threads = n;
  omp_set_num_threads(n);
}

int threads_or_default(int64_t requested, const char* what) {
  check_thread_request(requested, what, "the default, " + std::to_string(num_threads()) + " here");
  return requested > 0 ? static_cast<int>(clamp_to_cores(requested, what)) : num_threads();
}

}  // namespace loom
