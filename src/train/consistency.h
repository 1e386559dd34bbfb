// The checks that a run's tokenizer, token files and model belong together (data/provenance.h has the
// rules), at the places loom brings them together: training (open_run_data), evaluation, loading a run
// or weights file, and import. Each runs before any compute and names both files.
#pragma once

#include <string>

#include "data/token_file.h"
#include "train/config.h"
#include "train/run.h"

namespace loom::train {

// Training: data.tokenizer must be the tokenizer data.train's meta.json records (and exist when meta.json
// records one: samples and checkpoints use it), and its vocabulary must fit model.vocab_size.
void check_training_tokenizer(const TrainConfig& config, const std::string& meta_path);
// Training: every id in the token file is below model.vocab_size; `key` is its config key (data.train).
void check_training_tokens(const TrainConfig& config, const data::TokenFile& tokens, const std::string& key);

// A loaded run or weights file (`source` names it): its tokenizer's vocabulary fits the model's.
void check_loaded_run(const LoadedRun& run, const std::string& source);

// Evaluation of `run` (`source` names it) on the token file at data_path: the run's tokenizer must be the
// one its meta.json records, and the data's vocabulary must fit the model. Returns a note for the user
// when meta.json records a tokenizer but the run has none to compare it with (else "").
std::string check_eval_data(const LoadedRun& run, const std::string& source, const std::string& data_path);

}  // namespace loom::train
