// Hugging Face DeepSeek-V3 directories: export a loom DeepSeek-V3 so that transformers loads it as
// DeepseekV3ForCausalLM, and import such a directory back (bitwise after loom -> HF -> loom).
//
// Names (loom -> HF; Linear weights are [out, in] in both, nothing is transposed):
//   token_embeddings.weight              model.embed_tokens.weight
//   layers.N.attn_norm / ffn_norm        model.layers.N.input_layernorm / post_attention_layernorm
//   layers.N.attn.wq_a / q_norm / wq_b   model.layers.N.self_attn.q_a_proj / q_a_layernorm / q_b_proj
//   layers.N.attn.wkv_a / kv_norm        model.layers.N.self_attn.kv_a_proj_with_mqa / kv_a_layernorm
//   layers.N.attn.wkv_b / wo             model.layers.N.self_attn.kv_b_proj / o_proj
//   layers.N.mlp.w1 / w3 / w2            model.layers.N.mlp.gate_proj / up_proj / down_proj   (dense)
//   layers.N.moe.router.weight           model.layers.N.mlp.gate.weight
//   layers.N.moe.bias (state)            model.layers.N.mlp.gate.e_score_correction_bias
//   layers.N.moe.shared.w1 / w3 / w2     model.layers.N.mlp.shared_experts.gate_proj / up_proj / down_proj
//   layers.N.moe.experts.w1[e] / w3 / w2 model.layers.N.mlp.experts.e.gate_proj / up_proj / down_proj
//   ln_final.weight / lm_head.weight     model.norm.weight / lm_head.weight
// The MTP modules as DeepSeek's checkpoints carry them, as extra layers M = num_hidden_layers + k:
//   mtp.k.norm_e / norm_h                model.layers.M.enorm / hnorm
//   mtp.k.proj                           model.layers.M.eh_proj   (input halves swapped: DeepSeek
//                                        concatenates [enorm(e) ; hnorm(h)], loom and the seed [h ; e])
//   mtp.k.block.*                        model.layers.M.{input_layernorm, self_attn.*, ...} (a dense block)
//   (copies) ln_final, lm_head, token_embeddings
//                                        model.layers.M.shared_head.norm / shared_head.head / embed_tokens
// transformers builds num_hidden_layers layers and ignores the extra one.
//
// RoPE: loom rotates the pairs (x[i], x[i + P/2]) of the d_rope part (rotate-half). DeepSeek's checkpoints,
// and transformers with rope_interleave = true (its default), take that part as interleaved pairs
// (x[2i], x[2i+1]) and reorder it to rotate-half before rotating. Export writes rope_interleave = true
// with the rope rows of q_b_proj (each head's last P rows) and kv_a_proj_with_mqa (its last P rows)
// reordered: HF row 2i <- loom row i, HF row 2i+1 <- loom row i + P/2. q.k is unchanged since q and k get
// the same reordering. Import undoes it, or reads the rows as they are when rope_interleave is false.
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

// w: [H*(N+P), C] (heads of N rows then P rope rows) or [R+P, C] (heads = 1, N = R): the rope rows from
// loom's rotate-half order to interleaved pairs, and back.
Tensor rope_rows_to_interleaved(const Tensor& w, int64_t heads, int64_t nope, int64_t rope);
Tensor rope_rows_from_interleaved(const Tensor& w, int64_t heads, int64_t nope, int64_t rope);

// Writes config.json, model.safetensors (F32, HF names), generation_config.json and the tokenizer files.
void export_hf(const models::LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir);
models::HfImport import_hf(const std::string& dir, const nlohmann::json& hf_config);

}  // namespace loom::deepseek_v3
