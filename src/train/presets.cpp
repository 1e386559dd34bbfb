#include "train/presets.h"

#include <algorithm>

#include "core/error.h"
#include "io/json.h"
#include "io/json_checked.h"
#include "train/config.h"

namespace loom::train {
using nlohmann::json;

namespace {

const Preset* find_preset(std::string_view name, std::span<const Preset> presets) {
  for (const Preset& p : presets) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string joined(const std::vector<std::string>& names, const char* separator) {
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : separator) + n;
  return all;
}

// model.arch as the layer states it, or "" when it does not.
std::string stated_arch(const json& layer) {
  if (layer.contains("model") && layer["model"].is_object() && layer["model"].contains("arch") &&
      layer["model"]["arch"].is_string()) {
    return layer["model"]["arch"].get<std::string>();
  }
  return "";
}

// Errors from the key and type checks say "config: ..."; this adds which preset they are about.
[[noreturn]] void rethrow_for_preset(const Error& e, std::string_view name) {
  std::string what = e.what();
  if (what.rfind("config: ", 0) == 0) what.erase(0, 8);
  throw Error(str("config: preset \"", name, "\" (configs/", name, ".json): ", what));
}

}  // namespace

std::vector<std::string> preset_names(std::span<const Preset> presets) {
  std::vector<std::string> names;
  for (const Preset& p : presets) names.emplace_back(p.name);
  return names;
}

std::string_view preset_text(const std::string& name, std::span<const Preset> presets) {
  const Preset* p = find_preset(name, presets);
  LOOM_CHECK(p != nullptr, "config: no preset named \"", name, "\" and no such file (presets: ",
             joined(preset_names(presets), ", "), ")");
  return p->text;
}

json resolve_layers(const json& first, const std::string& first_name, bool first_is_preset,
                   std::span<const Preset> presets) {
  // The chain from the first layer down its bases, each layer with its "base" key removed. A layer is
  // named in errors as `preset "tiny"` or by the file's path.
  std::vector<std::string> chain{first_name};
  std::vector<json> layers{first};
  const auto label = [&](size_t i) {
    return i == 0 && !first_is_preset ? chain[0] : str("preset \"", chain[i], "\"");
  };
  for (;;) {
    json& layer = layers.back();
    if (!layer.is_object() || !layer.contains("base")) break;
    LOOM_CHECK(layer["base"].is_string(), "config: ", label(layers.size() - 1), ": \"base\" must name a preset (",
               joined(preset_names(presets), ", "), "), got ", layer["base"].dump());
    const std::string base = layer["base"].get<std::string>();
    const Preset* found = find_preset(base, presets);
    LOOM_CHECK(found != nullptr, "config: ", label(layers.size() - 1), " names base \"", base,
               "\", which is not a preset (presets: ", joined(preset_names(presets), ", "), ")");
    const size_t seen = static_cast<size_t>(std::find(chain.begin(), chain.end(), base) - chain.begin());
    if (seen < chain.size() && (seen > 0 || first_is_preset)) {
      LOOM_FAIL("config: ", label(0), ": its bases form a cycle: ", joined(chain, " -> "), " -> ", base);
    }
    layer.erase("base");
    json next;
    try {
      next = io::parse_json(found->text, "the file");
    } catch (const Error& e) {
      rethrow_for_preset(e, base);
    }
    chain.push_back(base);
    layers.push_back(std::move(next));
  }

  // The root's family gives the defaults; every layer above must keep it (a gpt2 layer on a llama base
  // would inherit model keys the gpt2 family does not have).
  const std::string root_arch = stated_arch(layers.back());
  const std::string arch = root_arch.empty() ? "llama" : root_arch;
  json merged = TrainConfig::defaults_json(arch);
  for (size_t i = layers.size(); i-- > 0;) {
    const std::string layer_arch = stated_arch(layers[i]);
    if (!layer_arch.empty() && layer_arch != arch) {
      // A user's file is told which presets would do; a preset's own error stops there (listing the
      // family's presets resolves every preset, this one included).
      const std::string choices = i == 0 && !first_is_preset ? str(" (", preset_names_of_family(layer_arch, presets), ")") : "";
      LOOM_FAIL("config: ", label(i), " sets model.arch = \"", layer_arch, "\" but its base \"", chain[i + 1], "\" is a ",
                arch, " model; name a base of the ", layer_arch, " family", choices, " or none");
    }
    try {
      io::merge_checked(merged, layers[i], "");
    } catch (const Error& e) {
      if (i == 0 && !first_is_preset) {
        std::string what = e.what();
        if (what.rfind("config: ", 0) == 0) what.erase(0, 8);
        throw Error(str("config: ", chain[0], ": ", what));
      }
      rethrow_for_preset(e, chain[i]);
    }
  }
  return merged;
}

json resolve_preset(const std::string& name, std::span<const Preset> presets) {
  const std::string_view text = preset_text(name, presets);  // an unknown name says so, listing the presets
  json layer;
  try {
    layer = io::parse_json(text, "the file");
  } catch (const Error& e) {
    rethrow_for_preset(e, name);
  }
  return resolve_layers(layer, name, /*first_is_preset=*/true, presets);
}

std::string preset_names_of_family(const std::string& arch, std::span<const Preset> presets) {
  std::string names;
  for (const Preset& p : presets) {
    // A preset that does not resolve belongs to no family here; its own load names the problem (and
    // the test that loads every preset fails first).
    std::string its_arch;
    try {
      its_arch = stated_arch(resolve_preset(std::string(p.name), presets));
    } catch (const Error&) {
      continue;
    }
    if (its_arch == arch) names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  return names.empty() ? "none" : names;
}

}  // namespace loom::train
