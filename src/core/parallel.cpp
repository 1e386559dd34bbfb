#include "core/parallel.h"

#include <cstdlib>

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

int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void set_num_threads(int n) {
  LOOM_CHECK(n >= 1 && n <= kMaxThreads, "thread count must be in [1, ", kMaxThreads, "], got ", n);
  g_threads = n;
  omp_set_num_threads(n);
}

}  // namespace loom
