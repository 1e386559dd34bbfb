#include "models/deepseek_v3/names.h"

#include "models/deepseek_v3/config.h"

namespace loom::deepseek_v3 {
namespace {
using models::Change;

// wq_b: each head's d_nope rows, then its d_rope rows RoPE rotates. wkv_a: the latent's kv_rank rows,
// then the shared RoPE key's d_rope rows.
models::RopeRows q_rows(const nlohmann::json& model) {
  const Config c = Config::from_json(model);
  return {c.num_heads, c.d_nope, c.d_rope};
}
models::RopeRows kv_rows(const nlohmann::json& model) {
  const Config c = Config::from_json(model);
  return {1, c.kv_rank, c.d_rope};
}

// A block's names (loom suffix, HF suffix, change), the same in the main layers and the MTP modules'.
struct BlockName {
  const char* loom;
  const char* hf;
  models::Conversion how = {};
};
const BlockName kBlock[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight", {.hf = Change::RopeToInterleaved, .rope = q_rows}},
    {"attn.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight", {.hf = Change::RopeToInterleaved, .rope = kv_rows}},
    {"attn.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn.wkv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attn.wo.weight", "self_attn.o_proj.weight"},
    {"mlp.w1.weight", "mlp.gate_proj.weight"},  // dense layers
    {"mlp.w3.weight", "mlp.up_proj.weight"},
    {"mlp.w2.weight", "mlp.down_proj.weight"},
    {"moe.router.weight", "mlp.gate.weight"},  // MoE layers
    {"moe.bias", "mlp.gate.e_score_correction_bias", {.if_absent = "the routing bias starts at zero"}},  // state
    {"moe.shared.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"moe.shared.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"moe.experts.w1", "mlp.experts.{e}.gate_proj.weight", {.hf = Change::Slice}},  // [E, d_expert, C]
    {"moe.experts.w3", "mlp.experts.{e}.up_proj.weight", {.hf = Change::Slice}},
    {"moe.experts.w2", "mlp.experts.{e}.down_proj.weight", {.hf = Change::Slice}},
};

models::TensorTable make_table() {
  models::TensorTable t{.family = "DeepSeek-V3",
                        .counts = {{"i", "num_layers"}, {"k", "n_mtp"}, {"e", "n_routed"}},
                        .hf_ignored = {"*rotary_emb.inv_freq"}};  // a buffer some versions save, recomputed
  auto block = [&](const std::string& loom, const std::string& hf) {
    for (const BlockName& b : kBlock) t.rows.push_back({loom + b.loom, hf + b.hf, "", b.how});
  };
  t.rows.push_back({"token_embeddings.weight", "model.embed_tokens.weight", ""});
  block("layers.{i}.", "model.layers.{i}.");
  // The MTP modules as DeepSeek's checkpoints carry them: layers num_hidden_layers + k, which
  // transformers does not build. eh_proj takes [enorm(e) ; hnorm(h)], loom's proj (and the seed's)
  // [h ; e]; the layer also holds copies of the embedding, final norm and head, which loom shares.
  const std::string mtp = "model.layers.{k+num_layers}.";
  t.rows.push_back({"mtp.{k}.norm_e.weight", mtp + "enorm.weight", ""});
  t.rows.push_back({"mtp.{k}.norm_h.weight", mtp + "hnorm.weight", ""});
  t.rows.push_back({"mtp.{k}.proj.weight", mtp + "eh_proj.weight", "", {.hf = Change::SwapColumnHalves}});
  block("mtp.{k}.block.", mtp);
  t.rows.push_back({"token_embeddings.weight", mtp + "embed_tokens.weight", "", {.hf = Change::Copy}});
  t.rows.push_back({"ln_final.weight", mtp + "shared_head.norm.weight", "", {.hf = Change::Copy}});
  t.rows.push_back({"lm_head.weight", mtp + "shared_head.head.weight", "", {.hf = Change::Copy}});
  t.rows.push_back({"ln_final.weight", "model.norm.weight", ""});
  t.rows.push_back({"lm_head.weight", "lm_head.weight", "", {.tied_to = "token_embeddings.weight"}});
  return t;
}

}  // namespace

// Linear weights are [out, in] in both: nothing is transposed. RoPE: loom rotates the pairs (x[i],
// x[i + P/2]) of the d_rope part (rotate-half); DeepSeek's checkpoints, and transformers with
// rope_interleave = true (its default), take that part as interleaved pairs (x[2i], x[2i+1]) and reorder
// it to rotate-half before rotating. So the rope rows of q_b_proj (each head's last P) and
// kv_a_proj_with_mqa (its last P) are stored interleaved: HF row 2i <- loom row i, HF row 2i+1 <- loom
// row i + P/2; q.k is unchanged since q and k get the same reordering.
const models::TensorTable& tensor_names() {
  static const models::TensorTable t = make_table();
  return t;
}

}  // namespace loom::deepseek_v3
