#include "mesh/launch.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
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

LaunchedRank join_launched_ranks(const Mesh& mesh, ParallelMode mode) {
  const int64_t launched = launched_ranks();
  if (mesh.size() == 1 && launched == 1) return {};
  if (!mpi_built()) {
    validate_mesh_for_ranks(mesh, 1, "this loom, built without MPI, (one process)");
    LOOM_FAIL("this loom was built without MPI, so it cannot join the ", launched, " ranks its launcher started: "
              "install openmpi-bin libopenmpi-dev and rebuild");
  }
  LaunchedRank r;
  r.comm = mpi_world();
  validate_mesh_for_ranks(mesh, r.comm->size(),
                          launched > 1 ? "the launcher" : "loom (one process, not under mpirun or srun)");
  r.context = std::make_shared<RankContext>(RankContext{mesh, mode, r.comm.get(), r.comm->rank()});
  return r;
}

int64_t threads_per_local_rank() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local == nullptr) local = std::getenv("SLURM_NTASKS_PER_NODE");
  const int per_node = local ? std::max(1, std::atoi(local)) : 1;
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / per_node);
}

}  // namespace loom::dist
