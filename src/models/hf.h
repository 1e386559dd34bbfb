// Hugging Face transformers directories: the family-independent part. `export_hf` and `import_hf`
// dispatch on the model's family (Family::export_hf / import_hf, chosen by config.json's model_type on
// import); the helpers below are what the family converters share. The weights go through the family's
// table of tensor names (models/tensor_names.h): a family writes only its config.json mapping.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/tensor_names.h"
#include "tokenizer/tokenizer.h"

namespace loom::models {

// Writes the model as an HF directory of its family's layout into out_dir (created).
void export_hf(const LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir);
// Reads an HF directory of any registered family (config.json's model_type picks it).
HfImport import_hf(const std::string& dir);
// Whether `path` is a directory with an HF config.json.
bool is_hf_dir(const std::string& path);

// ---- helpers for the family converters ----------------------------------------------------------

// One tensor of an HF file as f32 (F32, BF16 or F16 stored; anything else is an error naming it).
Tensor hf_read_as_f32(const io::SafetensorsFile& file, const std::string& name);
// A JSON object file, or an error naming it.
nlohmann::json hf_read_json(const std::filesystem::path& path);
// Written atomically, indented.
void hf_write_json(const std::filesystem::path& path, const nlohmann::json& j);
// The shortest decimal that reads back as the same float, as a JSON number (1e-05, not 9.99999974e-06).
nlohmann::json hf_float(float f);
// The weight files of a directory: model.safetensors, or the shards model.safetensors.index.json names.
std::vector<std::string> hf_weight_files(const std::string& dir);
// The id of <|endoftext|> in `tok`, if any (HF's bos/eos).
std::optional<int64_t> hf_end_of_text(const tokenizer::Tokenizer* tok);
// tokenizer.json (merges as "a b" strings, readable by every tokenizers version) and
// tokenizer_config.json; with gpt2_files, also vocab.json and merges.txt.
void hf_write_tokenizer(const tokenizer::Tokenizer& tok, const std::string& out_dir, int64_t model_max_length,
                        bool gpt2_files);
// The directory's tokenizer (tokenizer.json, or vocab.json + merges.txt) into out.tokenizer, or a note.
void hf_read_tokenizer(const std::string& dir, HfImport& out);
// Each weight file is opened once; `visit` sees every tensor name with its file. A name seen twice is
// an error.
void hf_for_each_tensor(const std::string& dir,
                        const std::function<void(const io::SafetensorsFile& file, const std::string& name)>& visit);
// The names of every tensor in the directory's weight files.
std::set<std::string> hf_tensor_names(const std::string& dir);

// model.safetensors (F32) with every tensor of `model` under its HF name (the family's table).
void hf_write_tensors(const LanguageModel& model, const TensorTable& table, const std::string& out_dir);
// config.json and generation_config.json, both with <|endoftext|> as bos and eos when `tok` has it, and
// the tokenizer's files (hf_write_tokenizer) when there is one.
void hf_write_configs(const std::string& out_dir, nlohmann::json config, nlohmann::json generation,
                      const tokenizer::Tokenizer* tok, int64_t model_max_length, bool gpt2_files);
// Loads every tensor of the directory into `model` through the family's table and reads the tokenizer:
// a tensor the model has no place for, one of the wrong shape, or one it lacks is an error naming it.
HfImport hf_import_model(std::unique_ptr<LanguageModel> model, const TensorTable& table, const std::string& dir,
                         const TensorImportOptions& options = {}, std::vector<std::string> notes = {});

}  // namespace loom::models
