// How a config file (`loom train --config FILE.json`) is read, beyond the key and type checks of
// TrainConfig::load:
//
//   * It is read exactly as a preset is (train/presets.h): its missing keys come from its base, the preset
//     its top-level "base" key names ({"base": "tiny", "training": {"max_steps": 50}}), resolved in full,
//     or, without "base", the built-in defaults (TrainConfig's, and those of the family model.arch names:
//     llama's are the CS336 model, gpt2's GPT-2 small, deepseek_v3's the seed's dsv3-mini). So
//     `--config configs/tiny.json` is `--config tiny`, and {"model": {"arch": "gpt2"}} is GPT-2 small. A
//     base of another model family than the file's model.arch is an error naming the family's presets.
//   * Relative paths in it (data.corpus, data.tokenizer, data.train, data.val) resolve against the
//     working directory, as in presets and in the config.json a run writes (so `--resume` finds the
//     same files); `loom train` prints each one resolved before it starts.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"

namespace loom::train {

// The file's JSON layered on its base (a preset, or the built-in defaults), complete. `path` names the
// file in errors.
nlohmann::json layer_on_base(const nlohmann::json& file, const std::string& path);

// One line per data path of the config, resolved against the working directory:
//   data.train = data/x/train.bin -> /home/me/loom/data/x/train.bin
std::vector<std::string> describe_data_paths(const TrainConfig& config);

}  // namespace loom::train
