// The built-in presets: configs/*.json compiled into loom, so `--config tiny` works from any directory.
//
// A preset states only what differs from its base, as nanoGPT's config/*.py override train.py's
// defaults. Its base is the preset its top-level "base" key names, resolved the same way (so bases
// chain: gpt2-medium <- gpt2-small <- the defaults), or, without "base", the built-in defaults:
// TrainConfig's and those of the model family model.arch names (llama when absent). A base must be of
// the preset's model family, and a chain of bases must end: an unknown base or a cycle is an error
// naming the preset.
//
// The table is generated at build time from configs/*.json (cmake/preset_table.cmake writes it into
// the build tree), so the files are the only copy: edit one and rebuild.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::train {

struct Preset {
  std::string_view name;  // the file's stem: configs/tiny.json is "tiny"
  std::string_view text;  // the file's JSON text, as written
};

// The compiled-in presets, ordered by name (generated from configs/*.json).
std::span<const Preset> builtin_presets();

// The presets' names, in table order.
std::vector<std::string> preset_names(std::span<const Preset> presets = builtin_presets());
// The preset's JSON text as compiled in; throws naming `name` and the known presets if there is none.
std::string_view preset_text(const std::string& name, std::span<const Preset> presets = builtin_presets());
// The preset's complete configuration: its chain of bases layered onto the built-in defaults, every key
// present and checked against the defaults' keys and types. Throws naming the preset (and the base) on
// an unknown base, a base of another model family, a cycle of bases or a bad key.
nlohmann::json resolve_preset(const std::string& name, std::span<const Preset> presets = builtin_presets());
// A config layer (a preset's JSON, or a user's file: first_is_preset false, first_name its path) resolved
// the same way: its chain of "base" presets layered onto the built-in defaults. Errors name the layer.
nlohmann::json resolve_layers(const nlohmann::json& first, const std::string& first_name, bool first_is_preset,
                              std::span<const Preset> presets = builtin_presets());
// The names of the presets whose model.arch is `arch`, comma-separated, or "none": for error messages.
std::string preset_names_of_family(const std::string& arch, std::span<const Preset> presets = builtin_presets());

}  // namespace loom::train
