// A model family's registration: how to check, build, count and convert models of one `arch`.
//
// Each family defines one Family in src/models/<family>/family.cpp; src/models/registry.cpp lists them.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "io/json_checked.h"
#include "models/model.h"
#include "models/stats.h"
#include "tokenizer/tokenizer.h"

namespace loom::models {

struct TensorTable;

// What a Hugging Face import produced.
struct HfImport {
  std::unique_ptr<LanguageModel> model;
  std::optional<tokenizer::Tokenizer> tokenizer;
  std::vector<std::string> notes;  // what was adapted or left out
};

// One tensor of a GGUF export, before it is stored: f32 in loom's shape (outermost first).
struct GgufTensorOut {
  std::string name;  // GGUF's name ("blk.0.attn_q.weight")
  Tensor value;
  bool matrix = false;  // a weight matrix, stored in the export's type; others (norm gains) stay F32
};

// What a GGUF import does with the matrices stored in a type src/quant has kernels for (Q8_0, Q4_0, Q4_1,
// Q4_K, Q6_K) and that a family can hold quantized (nn::Linear::set_quantized).
enum class GgufMatrices {
  F32,            // dequantized into the f32 parameters, like every other tensor
  AlsoQuantized,  // and held quantized beside them, for inference (loom chat, generate, serve)
  // Held quantized only: never dequantized whole, their f32 parameters left empty ([0]); the layers
  // multiply by the blocks (integer kernels, or dequantized tiles with dequantized_matmul). One copy of
  // the blocks: the file's mapping, read in place, without the interleaved copy the integer kernels read
  // faster (QLoRA: the memory is the point). Such a model cannot be exported or trained in those layers.
  QuantizedOnly,
};

// Every member has an initializer, so a family's designated initializers (family_of) may leave any out.
struct Family {
  std::string arch{};     // model.arch: "llama", "gpt2"
  std::string summary{};  // one line for listings

  // Every key of the model section with its default value, "arch" included. Config files are checked
  // against it key by key and type by type.
  nlohmann::json defaults{};
  // Checks a complete model section; throws loom::Error naming "model.<key>" and the value.
  std::function<void(const nlohmann::json& model)> validate{};
  // The relations between keys that validate checks (the family's ConfigFields), for `loom options --json`.
  std::vector<io::KeyRelation> relations{};
  std::function<std::unique_ptr<LanguageModel>(const ModelConfig& config, uint64_t seed)> build{};
  std::function<ModelStats(const nlohmann::json& model)> stats{};

  // Hugging Face: the config.json model_type this family reads, and the converters.
  std::string hf_model_type{};
  std::function<void(const LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir)> export_hf{};
  std::function<HfImport(const std::string& dir, const nlohmann::json& hf_config)> import_hf{};

  // GGUF (models/gguf.h): the general.architecture this family reads and writes, the reader (the
  // model only; the tokenizer is the caller's, `notes` gets what was adapted; `matrices` says what
  // becomes of the layers whose weights are stored in a type with kernels: GgufMatrices) and the writer
  // of the architecture's metadata and tensors (the caller adds general.*, the tokenizer, and quantizes).
  std::string gguf_arch{};
  std::function<std::unique_ptr<LanguageModel>(const gguf::GgufFile& file, GgufMatrices matrices,
                                               std::vector<std::string>& notes)>
      import_gguf{};
  std::function<void(const LanguageModel& model, std::vector<gguf::KeyValue>& metadata, std::vector<GgufTensorOut>& tensors)>
      export_gguf{};

  // The family's tensor names in HF and GGUF files (models/tensor_names.h): what PEFT's adapter files
  // call a layer (models/adapters.h).
  const TensorTable& (*tensor_table)() = nullptr;
};

// A family's Family: what it says itself (arch, summary, stats, converters: designated initializers)
// and what every family fills the same way from its Config type and model class: Config{}.to_json() as
// the defaults, Config::from_json to validate (errors prefixed "config: "), and the model built from
// Config and a seed.
template <typename Config, typename Model>
Family family_of(Family f) {
  f.defaults = Config{}.to_json();
  f.validate = [](const nlohmann::json& j) {
    try {
      Config::from_json(j);
    } catch (const Error& e) {
      const std::string what = e.what();
      throw Error(what.rfind("config: ", 0) == 0 ? what : "config: " + what);
    }
  };
  f.build = [](const ModelConfig& config, uint64_t seed) -> std::unique_ptr<LanguageModel> {
    return std::make_unique<Model>(Config::from_json(config.json()), seed);
  };
  return f;
}

// The registered families, in registration order.
const std::vector<const Family*>& families();
// The family of `arch`; throws naming it and the known families.
const Family& family(const std::string& arch);
// The family whose hf_model_type is `model_type`, if any.
const Family* family_for_hf(const std::string& model_type);
// The family whose gguf_arch is `arch`, if any.
const Family* family_for_gguf(const std::string& arch);

}  // namespace loom::models
