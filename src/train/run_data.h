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

}  // namespace loom::train
