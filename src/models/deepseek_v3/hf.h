// Hugging Face DeepSeek-V3 directories: export a loom DeepSeek-V3 so that transformers loads it as
// DeepseekV3ForCausalLM, and import such a directory back (bitwise after loom -> HF -> loom).
//
// Names: the family's table (names.cpp). The MTP modules are stored as DeepSeek's checkpoints carry
// them, as extra layers num_hidden_layers + k (which transformers ignores), with copies of the
// embedding, final norm and head; the rope rows of q_b_proj and kv_a_proj_with_mqa are interleaved, as
// rope_interleave = true (transformers' default) says. Import undoes it, or reads the rows as they are
// when rope_interleave is false.
//
// Supported on import: model_type deepseek_v3, hidden_act silu, q_lora_rank set, no attention bias,
// no rope scaling, moe_layer_freq 1, scoring_func sigmoid, topk_method noaux_tc, norm_topk_prob true,
// n_group groups whose topk_group selection keeps all of them (topk_group = n_group). Anything else that
// changes the model is an error naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/deepseek_v3/model.h"
#include "models/family.h"

namespace loom::deepseek_v3 {

// The loom config of an HF config.json (`path` names it in errors); n_mtp is num_nextn_predict_layers.
Config config_from_hf(const nlohmann::json& hf_config, const std::string& path);

// Writes config.json, model.safetensors (F32, HF names), generation_config.json and the tokenizer files.
void export_hf(const models::LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir);
models::HfImport import_hf(const std::string& dir, const nlohmann::json& hf_config);

}  // namespace loom::deepseek_v3
