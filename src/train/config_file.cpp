#include "train/config_file.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "models/family.h"
#include "train/presets.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kImplicitBase = "default";

std::string arch_of(const json& j) {
  if (j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("arch") &&
      j["model"]["arch"].is_string()) {
    return j["model"]["arch"].get<std::string>();
  }
  return "";
}

// `over` onto `base`, object by object; values that are not objects replace.
void merge_into(json& base, const json& over) {
  for (const auto& [key, value] : over.items()) {
    if (value.is_object() && base.contains(key) && base[key].is_object()) {
      merge_into(base[key], value);
    } else {
      base[key] = value;
    }
  }
}

}  // namespace

json layer_on_base(const json& file, const std::string& path) {
  if (!file.is_object()) return file;  // TrainConfig::load names the problem
  json over = file;
  std::string base_name = kImplicitBase;
  const bool named = over.contains("base");
  if (named) {
    const std::vector<std::string> names = preset_names();
    const auto known = [&names] {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      return all;
    };
    LOOM_CHECK(over["base"].is_string(), "config: ", path, ": \"base\" must name a preset (", known(), "), got ",
               over["base"].dump());
    base_name = over["base"].get<std::string>();
    LOOM_CHECK(std::find(names.begin(), names.end(), base_name) != names.end(), "config: ", path, ": \"base\": \"",
               base_name, "\" is not a preset (presets: ", known(), ")");
    over.erase("base");
  }
  json base = resolve_preset(base_name);  // complete, so the file's missing keys all come from it
  const std::string file_arch = arch_of(over), base_arch = arch_of(base);
  if (!file_arch.empty() && file_arch != base_arch) {
    LOOM_CHECK(!named, "config: ", path, " sets model.arch = \"", file_arch, "\" but its base preset \"", base_name,
               "\" is a ", base_arch, " model; name a base of the ", file_arch, " family (",
               preset_names_of_family(file_arch), ")");
    // No base named and another family: the model section cannot come from the default preset, so it must
    // be complete.
    std::string missing;
    for (const auto& [key, value] : models::family(file_arch).defaults.items()) {
      if (!over["model"].contains(key)) missing += (missing.empty() ? "" : ", ") + ("model." + key);
    }
    LOOM_CHECK(missing.empty(), "config: ", path, " has no \"base\" preset and its model.arch = \"", file_arch,
               "\" is not the ", base_arch, " family of the implicit base \"", kImplicitBase, "\", so it must give every ",
               "model key; missing: ", missing, ". Add \"base\": one of ", preset_names_of_family(file_arch));
    base.erase("model");
  }
  merge_into(base, over);
  return base;
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
