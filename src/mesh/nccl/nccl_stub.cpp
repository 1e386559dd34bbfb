// The NCCL communicator of a build without NCCL: without the CUDA toolkit (CMakeLists.txt), or with the
// toolkit but no NCCL beside it (cmake/cuda.cmake). Chosen by CMake instead of nccl_communicator.cpp.
#include "mesh/nccl/nccl_communicator.h"

#include "core/error.h"

namespace loom::dist {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, int, std::chrono::milliseconds) {
  LOOM_FAIL("nccl communicator: this loom was built without NCCL (no CUDA toolkit, or no NCCL beside it, when it "
            "was configured)");
}

}  // namespace loom::dist
