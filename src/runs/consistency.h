// The checks that a loaded run's tokenizer, token files and model belong together (data/provenance.h has
// the rules), where loom brings them together: evaluation, loading a run or weights file, and import
// (training's own checks are in train/run_data.cpp). Each runs before any compute and names both files.
#pragma once

#include <string>

#include "runs/load.h"

namespace loom::runs {

// A loaded run or weights file (`source` names it): its tokenizer's vocabulary fits the model's.
void check_loaded_run(const LoadedRun& run, const std::string& source);

// Evaluation of `run` (`source` names it) on the token file at data_path: the run's tokenizer must be the
// one its meta.json records, and the data's vocabulary must fit the model. Returns a note for the user
// when meta.json records a tokenizer but the run has none to compare it with (else "").
std::string check_eval_data(const LoadedRun& run, const std::string& source, const std::string& data_path);

}  // namespace loom::runs
