// Chosen by CMake when MPI is not found: loom runs one rank and says how to get more.
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "mesh/mpi.h"

namespace loom::dist {

bool mpi_built() { return false; }

std::shared_ptr<Communicator> mpi_world(std::chrono::milliseconds) {
  LOOM_FAIL("this loom was built without MPI: install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and "
            "reconfigure with cmake to train on more than one rank");
}

void mpi_abort(const std::string& why, int status) {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::exit(status);
}

}  // namespace loom::dist
