// How a config file (`loom train --config FILE.json`) is read, beyond the key and type checks of
// TrainConfig::load:
//
//   * Its missing keys come from a named preset (resolved in full: train/presets.h), never from defaults
//     that match no preset. The preset is the file's top-level "base" key ({"base": "tiny", "training":
//     {"max_steps": 50}}), or "default" (the preset `loom train` runs with no arguments) when the file
//     has none. A base of another model family than the file's model.arch is an error; a file without
//     "base" whose model.arch is not the default preset's family must spell out its whole model section
//     (or name a base of its family). Here a file differs from a preset, which without "base" sits on
//     the built-in defaults: configs/*.json are presets, loaded by name (`--config tiny`), not by path.
//   * Relative paths in it (data.corpus, data.tokenizer, data.train, data.val) resolve against the
//     working directory, as in presets and in the config.json a run writes (so `--resume` finds the
//     same files); `loom train` prints each one resolved before it starts.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"

namespace loom::train {

// The file's JSON layered on its base preset ("base" removed). `path` names the file in errors.
nlohmann::json layer_on_base(const nlohmann::json& file, const std::string& path);

// One line per data path of the config, resolved against the working directory:
//   data.train = data/x/train.bin -> /home/me/loom/data/x/train.bin
std::vector<std::string> describe_data_paths(const TrainConfig& config);

}  // namespace loom::train
