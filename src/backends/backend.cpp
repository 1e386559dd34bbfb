#include "backends/backend.h"

namespace loom {

void unsupported_device(const char* op, Device device) {
  LOOM_FAIL(op, ": no kernel for device ", device, " in this build (backends built: cpu)");
}

}  // namespace loom
