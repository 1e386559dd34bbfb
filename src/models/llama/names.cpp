#include "models/llama/names.h"

#include "models/llama/config.h"

namespace loom::llama {
namespace {
using models::Change;

// RoPE rotates every row of a head. q has num_heads heads, k the k/v heads (fewer with grouped-query
// attention).
models::RopeRows q_rows(const nlohmann::json& model) {
  const Config c = Config::from_json(model);
  return {c.num_heads, 0, c.head_dim()};
}
models::RopeRows k_rows(const nlohmann::json& model) {
  const Config c = Config::from_json(model);
  return {c.kv_heads(), 0, c.head_dim()};
}

}  // namespace

// Linear weights are [out, in] in all three: nothing is transposed. RoPE differs in HF: loom (and
// llama.cpp) rotate the pairs (x[2i], x[2i+1]) of each head, HF's rotate_half the pairs (x[i], x[i+D/2]).
// Reordering the rows of W_q and W_k within each head (HF row i <- loom row 2i, HF row D/2+i <- loom row
// 2i+1) makes HF's rotation of the reordered q equal the reordered loom rotation; q.k is unchanged since
// q and k get the same reordering. This is the inverse of the permute() in transformers'
// convert_llama_weights_to_hf.py, and what llama.cpp's converter undoes: GGUF rows are loom's as they are.
const models::TensorTable& tensor_names() {
  static const models::TensorTable t{
      .family = "Llama",
      .counts = {{"i", "num_layers"}},
      .rows = {
          // loom, Hugging Face, GGUF
          {"token_embeddings.weight", "model.embed_tokens.weight", "token_embd.weight"},
          {"layers.{i}.ln1.weight", "model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight"},
          {"layers.{i}.attn.q_proj.weight", "model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight",
           {.hf = Change::RopeToRotateHalf, .rope = q_rows}},
          {"layers.{i}.attn.k_proj.weight", "model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight",
           {.hf = Change::RopeToRotateHalf, .rope = k_rows}},
          {"layers.{i}.attn.v_proj.weight", "model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight"},
          {"layers.{i}.attn.output_proj.weight", "model.layers.{i}.self_attn.o_proj.weight",
           "blk.{i}.attn_output.weight"},
          {"layers.{i}.ln2.weight", "model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight"},
          {"layers.{i}.ffn.w1.weight", "model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight"},
          {"layers.{i}.ffn.w3.weight", "model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"},
          {"layers.{i}.ffn.w2.weight", "model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight"},
          {"ln_final.weight", "model.norm.weight", "output_norm.weight"},
          // Tied checkpoints (tie_word_embeddings, or a GGUF without output.weight) leave the head out:
          // loom's untied head gets a copy, which computes the same logits.
          {"lm_head.weight", "lm_head.weight", "output.weight", {.tied_to = "token_embeddings.weight"}},
      },
      .hf_ignored = {"*rotary_emb.inv_freq"},  // a buffer older transformers saved, recomputed
  };
  return t;
}

}  // namespace loom::llama
