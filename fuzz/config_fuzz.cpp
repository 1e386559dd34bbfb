// libFuzzer target over the training-config reader: the text as a config file (io::parse_json with the
// config limits, then TrainConfig::from_json: key and type checks, merge with the defaults, validation)
// and as the value of a --set override (parse_override, apply through load's path). Built and run by
// tools/fuzz.sh (ASan + UBSan). A finding is any crash, sanitizer report, exception other than
// loom::Error, or a broken invariant (reported through __builtin_trap):
//   * a refused input throws loom::Error and nothing else;
//   * an accepted config survives its own round trip: from_json(to_json(c)) is accepted and writes the
//     same JSON again.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "io/json.h"
#include "train/config.h"

using loom::train::TrainConfig;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json j = loom::io::parse_json(text, "fuzz config");
    const TrainConfig c = TrainConfig::from_json(j);
    const nlohmann::json written = c.to_json();
    require(TrainConfig::from_json(written).to_json() == written);
  } catch (const loom::Error&) {
  }
  // The same text as an override's value, on a key of each kind.
  for (const char* key : {"model.d_model", "optimizer.lr", "training.seed", "data.train", "logging.progress"}) {
    try {
      auto [path, value] = loom::train::parse_override(std::string(key) + "=" + std::string(text));
      nlohmann::json overlay = nlohmann::json::object();
      overlay[path.substr(0, path.find('.'))][path.substr(path.find('.') + 1)] = value;
      TrainConfig::from_json(overlay);
    } catch (const loom::Error&) {
    }
  }
  return 0;
}
