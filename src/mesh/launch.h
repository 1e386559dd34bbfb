// Joining the ranks a launcher started (mpirun, srun) as one mesh: what `loom train` does first on every
// rank, and what any program that trains on a mesh does too (docs/mesh.md). One process is one rank.
#pragma once

#include <cstdint>
#include <memory>

#include "mesh/communicator.h"
#include "mesh/mesh.h"
#include "mesh/rank_context.h"

namespace loom::dist {

// This rank of a multi-rank run: the world communicator and the context that points into it (the
// context holds the communicator by raw pointer, so keep the two together). Both are null for one
// process alone on a mesh of one.
struct LaunchedRank {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<RankContext> context;
};

// The mesh must use exactly the ranks that were started: a mesh of one on a process of its own is one
// process alone (nothing to join); otherwise MPI's world, checked against the mesh (a loom built without
// MPI refuses a launcher's ranks, saying how to get MPI). The context has the defaults of RankContext
// (overlap on, no expert-row cap) for the caller to change.
LaunchedRank join_launched_ranks(const Mesh& mesh, ParallelMode mode);

// The threads one rank takes when it is not told: the machine's cores shared among the ranks the launcher
// put on this node (OMPI_COMM_WORLD_LOCAL_SIZE, else SLURM_NTASKS_PER_NODE, else 1), at least 1.
int64_t threads_per_local_rank();

}  // namespace loom::dist
