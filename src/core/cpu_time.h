// CPU time, as the benchmarks and the communicator's statistics count it: what a thread or a process
// took, which other work on a shared machine does not inflate the way it inflates wall time.
#pragma once

#include <sys/resource.h>
#include <time.h>

namespace loom {

// The calling thread's CPU seconds.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// This process's CPU seconds, user and system, every thread.
inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace loom
