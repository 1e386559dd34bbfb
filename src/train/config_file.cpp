#include "train/config_file.h"

#include <filesystem>

#include "core/error.h"
#include "train/presets.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;

json layer_on_base(const json& file, const std::string& path) {
  if (!file.is_object()) return file;  // TrainConfig::load names the problem
  return resolve_layers(file, path, /*first_is_preset=*/false);
}

std::vector<std::string> describe_data_paths(const TrainConfig& c) {
  std::vector<std::string> lines;
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"data.corpus", &c.data.corpus},
                                   {"data.tokenizer", &c.data.tokenizer},
                                   {"data.train", &c.data.train},
                                   {"data.val", &c.data.val}}) {
    const fs::path p(*value);
    if (p.is_absolute()) {
      lines.push_back(str(key, " = ", *value));
    } else {
      lines.push_back(str(key, " = ", *value, " -> ", (cwd / p).lexically_normal().string()));
    }
  }
  return lines;
}

}  // namespace loom::train
