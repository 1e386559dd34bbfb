// MPI as loom's transport between processes (Open MPI from Debian; any MPI-3 library works).
//
// Built when CMake finds MPI (src/mesh/mpi/mpi.cpp); otherwise src/mesh/mpi/mpi_stub.cpp says so at run
// time, so nothing else in loom has an #ifdef. Every collective is non-blocking underneath and waited on
// with a deadline: when a peer dies (kill -9, a lost node), the survivors stop within `timeout` with a
// message naming the collective and the group, then MPI_Abort the job, instead of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "mesh/communicator.h"

namespace loom::dist {

// Whether this loom was built with MPI.
bool mpi_built();
// The number of ranks a launcher started, from its environment (Open MPI's OMPI_COMM_WORLD_SIZE, PMI's
// PMI_SIZE, an srun step's SLURM_STEP_NUM_TASKS), or 1 when loom runs on its own. Needs no MPI.
int64_t launched_ranks();
// The world communicator. Initialises MPI on first use and finalises it at exit. Throws when loom was
// built without MPI.
std::shared_ptr<Communicator> mpi_world(std::chrono::milliseconds timeout = std::chrono::minutes(5));
// Ends every rank of the job now (MPI_Abort), after printing `why` on this rank's stderr. For errors
// one rank cannot recover from while the others wait on it.
[[noreturn]] void mpi_abort(const std::string& why, int status = 1);

}  // namespace loom::dist
