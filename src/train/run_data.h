// Opens a run's token files as the config says, with every check that needs the data: the files exist,
// their dtype comes from meta.json, the tokenizer's vocabulary fits the model's embedding table, and a
// batch fits in each file. Errors name the config keys, so they read like the other config errors.
#pragma once

#include <optional>

#include "data/batch.h"
#include "data/token_file.h"
#include "train/config.h"

namespace loom::train {

struct RunData {
  data::BatchLoader train;               // training.sampling, key seed.fold_in("train")
  std::optional<data::BatchLoader> val;  // random windows, key seed.fold_in("val"); absent if eval.interval == 0
  data::TokenMeta meta;                  // from data.train's meta.json
};

RunData open_run_data(const TrainConfig& config);

// Creates the tokenizer and token files the config names when they are missing. Returns a line per
// thing it made, for the console.
std::vector<std::string> ensure_training_data(const TrainConfig& config, bool progress = true);

// Puts the run's tokenizer in <run_dir>/tokenizer.json: data.tokenizer copied byte for byte when it is
// a tokenizer.json, converted when it is a vocab.json + merges.txt folder (GPT-2's own). Nothing when
// data.tokenizer does not exist.
void save_run_tokenizer(const TrainConfig& config, const std::string& run_dir);

}  // namespace loom::train
