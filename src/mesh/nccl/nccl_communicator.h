// NCCL behind the mesh's Communicator interface (mesh/communicator.h): one process per GPU, started by
// an MPI launcher (mpirun -np N, one rank per GPU), with the MPI communicator as the bootstrap that
// hands NCCL's unique ids around.
//
// Differences from the CPU communicators, which the interface's conventions allow for:
//   * Data pointers are device memory on this rank's GPU (cuda:device), and collectives run on that
//     device's compute stream (after the ops queued before them).
//   * Sums are NCCL's (a ring or tree order, not group order); every member still gets the same bits.
//   * Nothing waits forever: each call waits with a deadline, polling NCCL's asynchronous error, and a
//     collective a peer never joins aborts the NCCL communicator and throws naming the collective.
#pragma once

#include <chrono>
#include <memory>

#include "mesh/communicator.h"

namespace loom::dist {

// Whether this build has NCCL.
bool nccl_built();
// A communicator over the same world as `bootstrap` (normally dist::mpi_world()), with this rank on
// cuda:`device`. Groups get their own NCCL communicators on first use, made by their members only.
std::unique_ptr<dist::Communicator> make_nccl_communicator(std::shared_ptr<dist::Communicator> bootstrap,
                                                           int device,
                                                           std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace loom::dist
