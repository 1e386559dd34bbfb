// A training run on disk, and everything `loom train` does around the loop:
//   * ensure_training_data: trains the BPE tokenizer on the corpus unless data.tokenizer exists, and
//     prepares data.train / data.val unless they exist;
//   * save_run_weights / load_run: DIR/model.safetensors (parameters under their dotted names, the
//     model config in the metadata), DIR/config.json, DIR/tokenizer.json.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "train/config.h"
#include "train/memory.h"

namespace loom::train {

// Creates the tokenizer and token files the config names when they are missing. Returns a line per
// thing it made, for the console.
std::vector<std::string> ensure_training_data(const TrainConfig& config, bool progress = true);

// Puts the run's tokenizer in <run_dir>/tokenizer.json: data.tokenizer copied byte for byte when it is
// a tokenizer.json, converted when it is a vocab.json + merges.txt folder (GPT-2's own). Nothing when
// data.tokenizer does not exist.
void save_run_tokenizer(const TrainConfig& config, const std::string& run_dir);

// Copies every parameter and state tensor (LanguageModel::state_tensors) of `model` from `file`, by
// name; the file must hold exactly those tensors. `where` names the file in errors.
void load_model_tensors(models::LanguageModel& model, const io::SafetensorsFile& file, const std::string& where);
// Writes the model's parameters and state tensors (with the model config in the safetensors metadata, key
// "loom.model_config") atomically to `path`.
void save_model_weights(const models::LanguageModel& model, const std::string& path);
// Reads weights written by save_model_weights: the config from the metadata, every parameter and state
// tensor by name.
// The model the metadata describes, and what the caller will do with it (`job`), are held to `memory`
// before the model is built (train/memory.h).
std::unique_ptr<models::LanguageModel> load_model_weights(const std::string& path,
                                                          const MemoryBudget& memory = MemoryBudget::of_machine(),
                                                          const ModelJobMemory& job = model_memory);

struct LoadedRun {
  std::unique_ptr<models::LanguageModel> model;
  std::optional<tokenizer::Tokenizer> tokenizer;  // when the run (or the weights' folder) has one
  std::string tokenizer_path;                     // the file (or folder) it was read from
  std::optional<TrainConfig> config;              // when the run has config.json
  std::optional<tokenizer::TokenId> eos;          // a GGUF file's end-of-sequence token
  std::string chat_template;                      // a GGUF file's chat template
};
// `dir` is a run directory (model.safetensors, config.json, tokenizer.json), or a Hugging Face
// directory of a family loom reads (models/hf.h).
// The tokenizer's vocabulary must fit the model's (train/consistency.h); the model and `job` must fit
// `memory` (a Hugging Face directory: its import, train/memory.h hf_import_memory).
LoadedRun load_run(const std::string& dir, const MemoryBudget& memory = MemoryBudget::of_machine(),
                   const ModelJobMemory& job = model_memory);
// `path` is a weights file (a tokenizer.json beside it is loaded too), a Hugging Face directory
// (models/hf.h), or a GGUF file with its tokenizer (models/gguf.h; dequantized to f32).
// With quantized_gguf, a GGUF's quantized matrices are also kept quantized for inference
// (models::import_gguf); such a model cannot be trained.
LoadedRun load_weights(const std::string& path, const MemoryBudget& memory = MemoryBudget::of_machine(),
                       const ModelJobMemory& job = model_memory, bool quantized_gguf = false);

}  // namespace loom::train
