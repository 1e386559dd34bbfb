// NCCL communicator of a CUDA build without NCCL (cmake/cuda.cmake chooses this file).
#include "backends/cuda/nccl/nccl_communicator.h"

#include "core/error.h"

namespace loom::cuda {

bool nccl_built() { return false; }

std::unique_ptr<dist::Communicator> make_nccl_communicator(std::shared_ptr<dist::Communicator>, int,
                                                           std::chrono::milliseconds) {
  LOOM_FAIL("nccl communicator: this loom was built without NCCL (not found beside the CUDA toolkit when it "
            "was configured)");
}

}  // namespace loom::cuda
