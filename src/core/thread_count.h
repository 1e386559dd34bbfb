// The one bound on every `threads=` argument: the CLI's --threads, a config's training.threads, the
// Python module's threads=, the tokenizer's EncodeOptions and TrainOptions. Header-only and free of
// OpenMP, so that code which only starts std::threads (the tokenizer) does not pull in parallel.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <thread>

#include "core/error.h"

namespace loom {

// Far above any machine loom runs on, yet low enough that a typo (threads=100000) is an error naming
// the value, not a std::thread that fails to start and aborts the process (a joinable std::thread
// destroyed during unwinding calls std::terminate), nor an OpenMP team of 100,000 threads.
inline constexpr int64_t kMaxThreads = 1024;

// Checks that `requested` is in [0, kMaxThreads]. `what` names the argument in the error ("encode:
// threads"), `zero_means` what 0 stands for ("every core").
inline void check_thread_request(int64_t requested, std::string_view what, std::string_view zero_means) {
  LOOM_CHECK(requested >= 0 && requested <= kMaxThreads, what, " must be in [0, ", kMaxThreads, "] (0: ",
             zero_means, "), got ", requested);
}

// The cores of this machine (at least 1).
inline int64_t machine_cores() {
  return std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, kMaxThreads);
}

// A thread count above the machine's cores only slows the work (threads=1000 on 2 cores ran 13x slower):
// every threads= request, whatever asked (CLI, config, Python), is clamped to the cores here, with one
// line on stderr that says so. Returns the count to use.
inline int64_t clamp_to_cores(int64_t requested, std::string_view what) {
  const int64_t cores = machine_cores();
  if (requested <= cores) return requested;
  std::fprintf(stderr, "note: %.*s=%lld is more than this machine's %lld cores: using %lld\n",
               static_cast<int>(what.size()), what.data(), static_cast<long long>(requested),
               static_cast<long long>(cores), static_cast<long long>(cores));
  return cores;
}

// `requested` checked to be in [0, kMaxThreads] and clamped to the cores, with 0 (every core) resolved
// to the core count.
inline int resolve_thread_count(int64_t requested, std::string_view what) {
  check_thread_request(requested, what, "every core");
  if (requested > 0) return static_cast<int>(clamp_to_cores(requested, what));
  return static_cast<int>(machine_cores());
}

}  // namespace loom
