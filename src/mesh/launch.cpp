#include <cstdlib>
#include <string>

#include "mesh/mpi.h"

namespace loom::dist {

int64_t launched_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    if (const char* v = std::getenv(var)) {
      const long long n = std::atoll(v);
      if (n >= 1) return n;
    }
  }
  return 1;
}

}  // namespace loom::dist
