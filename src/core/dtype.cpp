#include "core/dtype.h"

namespace loom {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string index = s.substr(5);
    LOOM_CHECK(!index.empty() && index.size() <= 4 && index.find_first_not_of("0123456789") == std::string::npos,
               "device '", s, "': expected cuda:N with N a device index");
    return Device::cuda(std::stoi(index));
  }
  LOOM_FAIL("unknown device '", s, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace loom
