// GGUF model files (llama.cpp, ollama, LM Studio): the family-independent part of import and export.
// A family reads and writes its architecture's metadata and tensors (Family::import_gguf/export_gguf,
// chosen by general.architecture); this layer adds the tokenizer (gguf/tokenizer.h), general.*,
// and the storage type of the weight matrices. The tensors go through the family's table of tensor
// names (models/tensor_names.h): a family writes only its metadata mapping.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "gguf/tokenizer.h"
#include "models/family.h"
#include "models/tensor_names.h"
#include "nn/parameter.h"
#include "quant/quant.h"

namespace loom::models {

// What a GGUF import produced: the model, its tokenizer (when the file has one), bos/eos and the chat
// template, and notes on what was adapted.
struct GgufImport {
  std::unique_ptr<LanguageModel> model;
  std::optional<tokenizer::Tokenizer> tokenizer;
  std::optional<tokenizer::TokenId> bos, eos;
  std::string chat_template;
  std::vector<std::string> notes;
};

// Whether `path` is a regular file that starts with GGUF's magic.
bool is_gguf_file(const std::string& path);
// Reads a GGUF model of any registered family. Errors name the file and the value. With `quantized`,
// matrices stored in a type src/quant has kernels for are also kept quantized for inference (see the
// family's import_gguf); without, everything is f32. With `quantized_only` too, those matrices are held
// quantized only and never dequantized whole (GgufMatrices::QuantizedOnly).
GgufImport import_gguf(const std::string& path, bool quantized = false, bool quantized_only = false);

struct GgufExportOptions {
  // Storage of the weight matrices (embedding, projections, head); norm gains stay F32. F32, F16, BF16,
  // Q8_0, Q4_0 or Q4_1 (quant::quantize); a matrix whose rows are not whole blocks is refused.
  quant::QuantType type = quant::QuantType::F16;
  std::string name;  // general.name
  std::optional<tokenizer::TokenId> bos, eos;
  std::string chat_template;
};
// Writes `model` (and `tok`, when given) as a GGUF v3 file, atomically.
void export_gguf(const LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& path,
                 const GgufExportOptions& options);
// The export type named on the command line ("f32", "F16", "q8_0", ...), or an error listing the choices.
quant::QuantType gguf_export_type(const std::string& name);

// Every tensor of `model` under its GGUF name (the family's table), in llama.cpp's order; matrices are
// marked for the export's storage type. A head equal to its tied embedding is left out.
void gguf_tensors_of(const LanguageModel& model, const TensorTable& table, std::vector<GgufTensorOut>& tensors);
// Loads every tensor of `file` (dequantized) into `model` through the family's table: a tensor the
// model has no place for, one of the wrong shape, or one it lacks is an error naming it. The loom
// tensors in `held_quantized` are the caller's (held quantized only): theirs are checked but not read.
void gguf_load_tensors(LanguageModel& model, const TensorTable& table, const gguf::GgufFile& file,
                       std::vector<std::string>& notes, const std::set<std::string>& held_quantized = {});

// A family's size key: an unsigned integer in [1, 2^40], or an error naming the key and its value.
int64_t gguf_positive_key(const gguf::Header& h, const std::string& key);
// The vocabulary of architecture `arch`: ARCH.vocab_size, else the rows of token_embd.weight.
int64_t gguf_vocab_size(const gguf::Header& h, const std::string& arch);

// A family's model read from `file`: its config (read_config(header); an error names the file), the
// model built without initializing its parameters, and every tensor loaded through the family's table.
template <class Model, class ReadConfig>
std::unique_ptr<Model> gguf_build_model(const gguf::GgufFile& file, ReadConfig read_config, const TensorTable& table,
                                        std::vector<std::string>& notes,
                                        const std::set<std::string>& held_quantized = {}) {
  decltype(read_config(file.header())) cfg;
  try {
    cfg = read_config(file.header());
  } catch (const Error& e) {
    LOOM_FAIL(file.path(), ": ", e.what());
  }
  std::unique_ptr<Model> model;
  {
    nn::SkipInitGuard no_init;  // every parameter is loaded below, or the import fails
    model = std::make_unique<Model>(cfg, 0);
  }
  gguf_load_tensors(*model, table, file, notes, held_quantized);
  return model;
}

// bos/eos/chat template kept beside an imported tokenizer: DIR/tokenizer_config.json in Hugging Face's
// form (bos_token, eos_token, chat_template). Written by `loom import --gguf`, read by the GGUF export.
void write_tokenizer_config(const std::string& dir, const tokenizer::Tokenizer& tok, std::optional<tokenizer::TokenId> bos,
                            std::optional<tokenizer::TokenId> eos, const std::string& chat_template,
                            int64_t model_max_length);
void read_tokenizer_config(const std::string& dir, const tokenizer::Tokenizer& tok, GgufExportOptions& options);

}  // namespace loom::models
