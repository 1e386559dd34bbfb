// Weights and runs on disk, for everything that loads a model (train --weights, generate, chat, eval,
// export, Python) and the trainer that saves one:
//   * save_model_weights / load_model_weights: a weights file, model.safetensors (parameters under their
//     dotted names, the model config in the metadata);
//   * load_run: a run directory (model.safetensors, config.json, tokenizer.json) or a Hugging Face one;
//   * load_weights: any of those, or a GGUF file.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "runs/memory.h"

namespace loom::runs {

// Copies every parameter and state tensor (LanguageModel::state_tensors) of `model` from `file`, by
// name; the file must hold exactly those tensors. `where` names the file in errors.
void load_model_tensors(models::LanguageModel& model, const io::SafetensorsFile& file, const std::string& where);
// Writes the model's parameters and state tensors (with the model config in the safetensors metadata, key
// "loom.model_config") atomically to `path`.
void save_model_weights(const models::LanguageModel& model, const std::string& path);
// Reads weights written by save_model_weights: the config from the metadata, every parameter and state
// tensor by name.
// The model the metadata describes, and what the caller will do with it (`job`), are held to `memory`
// before the model is built (runs/memory.h).
std::unique_ptr<models::LanguageModel> load_model_weights(const std::string& path,
                                                          const MemoryBudget& memory = MemoryBudget::of_machine(),
                                                          const ModelJobMemory& job = model_memory);

// Throws loom::Error naming the tensor and the element when an f32 CPU parameter holds NaN or Inf (the
// loaders below call it; so does Python's Model.load, over load_model_weights).
void check_weights_finite(models::LanguageModel& model, const std::string& where);

struct LoadedRun {
  std::unique_ptr<models::LanguageModel> model;
  std::optional<tokenizer::Tokenizer> tokenizer;  // when the run (or the weights' folder) has one
  std::string tokenizer_path;                     // the file (or folder) it was read from
  std::optional<nlohmann::json> config;           // the run's config.json, as the trainer wrote it
  std::optional<tokenizer::TokenId> eos;          // a GGUF file's end-of-sequence token
  std::string chat_template;                      // a GGUF file's chat template
};
// `dir` is a run directory (model.safetensors, config.json, tokenizer.json), or a Hugging Face
// directory of a family loom reads (models/hf.h).
// The tokenizer's vocabulary must fit the model's (runs/consistency.h); the model and `job` must fit
// `memory` (a Hugging Face directory: its import, runs/memory.h hf_import_memory).
LoadedRun load_run(const std::string& dir, const MemoryBudget& memory = MemoryBudget::of_machine(),
                   const ModelJobMemory& job = model_memory);
// `path` is a weights file (a tokenizer.json beside it is loaded too), a Hugging Face directory
// (models/hf.h), or a GGUF file with its tokenizer (models/gguf.h; dequantized to f32).
// With quantized_gguf, a GGUF's quantized matrices are also kept quantized for inference
// (models::import_gguf); such a model cannot be trained.
// quantized_only too: those matrices are held quantized only, never in f32 (models::GgufMatrices).
LoadedRun load_weights(const std::string& path, const MemoryBudget& memory = MemoryBudget::of_machine(),
                       const ModelJobMemory& job = model_memory, bool quantized_gguf = false,
                       bool quantized_only = false);

// A model for `job`: the run directory `run` when it is given, else `weights` (load_weights; with
// quantized_gguf a GGUF stays quantized). `job` estimates what the caller will do with the model
// (generation_memory for generate and chat): it is held to `memory` before the model is built, from the
// config the files describe, and again after, from the model built (a Hugging Face directory is checked
// before as its import). `job_name` names the job in that error ("generate", "chat").
LoadedRun load_for_job(const std::string& run, const std::string& weights, const MemoryBudget& memory,
                       const ModelJobMemory& job, const std::string& job_name, bool quantized_gguf = false,
                       bool quantized_only = false);

// What a conversation with a model needs beside the weights: its chat template and end-of-sequence token.
struct ChatSettings {
  std::string chat_template;                // "" when there is none
  std::optional<tokenizer::TokenId> eos;
};
// A GGUF file's own; for a run directory (`run_dir`, "" for a weights file) without a chat template, the
// chat template of its tokenizer_config.json (written by `loom import --gguf` and `loom train --weights
// X.gguf`), and its eos when the weights name none. Needs loaded.tokenizer for that file.
ChatSettings chat_settings(const LoadedRun& loaded, const std::string& run_dir);

}  // namespace loom::runs
