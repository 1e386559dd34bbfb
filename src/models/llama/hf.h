// Hugging Face Llama directories: export a loom Llama so that transformers loads it as
// LlamaForCausalLM, and import such a directory (loom's, or one loom did not write) back.
//
// Names: the family's table (names.cpp), q and k rows reordered for HF's rotate-half RoPE.
//
// Supported on import: model_type "llama", hidden_act silu, no attention or MLP biases, no rope scaling,
// grouped-query attention (num_key_value_heads dividing num_attention_heads), head_dim =
// hidden_size / num_attention_heads; RoPE θ from `rope_theta` (transformers 4) or
// `rope_parameters.rope_theta` (transformers 5); tied embeddings are untied (lm_head = a copy of
// embed_tokens); weights in model.safetensors or shards named by model.safetensors.index.json, as F32,
// BF16 or F16 (converted to F32). Anything else that changes the model is an error naming the option.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/family.h"
#include "models/llama/model.h"

namespace loom::llama {

// w: [H*D, C] rows in loom's interleaved order per head -> HF's rotate-half order, and back.
Tensor interleaved_to_rotate_half(const Tensor& w, int64_t num_heads);
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t num_heads);

// The HF name of a loom parameter name (throws on a name outside the mapping), and back (nullopt when
// the HF name is not a Llama parameter loom knows).
std::string hf_parameter_name(const std::string& loom_name);
std::optional<std::string> loom_parameter_name(const std::string& hf_name);

// The loom config of an HF config.json (`path` names it in errors).
Config config_from_hf(const nlohmann::json& hf_config, const std::string& path);

// Writes config.json, model.safetensors (F32, HF names, q/k permuted), generation_config.json, and
// with a tokenizer, tokenizer.json and tokenizer_config.json, into out_dir (which exists).
void export_hf(const models::LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir);
// Reads an HF Llama directory (see the supported options above).
models::HfImport import_hf(const std::string& dir, const nlohmann::json& hf_config);

}  // namespace loom::llama
