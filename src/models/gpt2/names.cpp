#include "models/gpt2/names.h"

namespace loom::gpt2 {
namespace {
using models::Change;
constexpr Change kT = Change::Transpose;
}  // namespace

// HF's Conv1D stores weights [in, out], so every HF matrix is transposed; GGUF's ne = [in, out] is loom's
// [out, in] (the same bytes). q, k and v are one tensor in both, stacked on the output dim (q first):
// c_attn [C, 3C] in HF, attn_qkv [3C, C] in GGUF. Both always have the q/k/v and attention-output
// biases: a loom model without them exports zeros (the same function). The head is absent when tied.
const models::TensorTable& tensor_names() {
  static const models::TensorTable t{
      .family = "GPT-2",
      .counts = {{"i", "num_layers"}},
      .rows = {
          // loom, Hugging Face, GGUF
          {"token_embeddings.weight", "transformer.wte.weight", "token_embd.weight"},
          {"position_embeddings.weight", "transformer.wpe.weight", "position_embd.weight"},
          {"layers.{i}.ln1.weight", "transformer.h.{i}.ln_1.weight", "blk.{i}.attn_norm.weight"},
          {"layers.{i}.ln1.bias", "transformer.h.{i}.ln_1.bias", "blk.{i}.attn_norm.bias"},
          {"layers.{i}.attn.q_proj.weight", "transformer.h.{i}.attn.c_attn.weight", "blk.{i}.attn_qkv.weight",
           {.hf = kT, .part = {0, 3}}},
          {"layers.{i}.attn.k_proj.weight", "transformer.h.{i}.attn.c_attn.weight", "blk.{i}.attn_qkv.weight",
           {.hf = kT, .part = {1, 3}}},
          {"layers.{i}.attn.v_proj.weight", "transformer.h.{i}.attn.c_attn.weight", "blk.{i}.attn_qkv.weight",
           {.hf = kT, .part = {2, 3}}},
          {"layers.{i}.attn.q_proj.bias", "transformer.h.{i}.attn.c_attn.bias", "blk.{i}.attn_qkv.bias",
           {.part = {0, 3}, .zeros_if_absent = true}},
          {"layers.{i}.attn.k_proj.bias", "transformer.h.{i}.attn.c_attn.bias", "blk.{i}.attn_qkv.bias",
           {.part = {1, 3}, .zeros_if_absent = true}},
          {"layers.{i}.attn.v_proj.bias", "transformer.h.{i}.attn.c_attn.bias", "blk.{i}.attn_qkv.bias",
           {.part = {2, 3}, .zeros_if_absent = true}},
          {"layers.{i}.attn.output_proj.weight", "transformer.h.{i}.attn.c_proj.weight", "blk.{i}.attn_output.weight",
           {.hf = kT}},
          {"layers.{i}.attn.output_proj.bias", "transformer.h.{i}.attn.c_proj.bias", "blk.{i}.attn_output.bias",
           {.zeros_if_absent = true}},
          {"layers.{i}.ln2.weight", "transformer.h.{i}.ln_2.weight", "blk.{i}.ffn_norm.weight"},
          {"layers.{i}.ln2.bias", "transformer.h.{i}.ln_2.bias", "blk.{i}.ffn_norm.bias"},
          {"layers.{i}.mlp.fc.weight", "transformer.h.{i}.mlp.c_fc.weight", "blk.{i}.ffn_up.weight", {.hf = kT}},
          {"layers.{i}.mlp.fc.bias", "transformer.h.{i}.mlp.c_fc.bias", "blk.{i}.ffn_up.bias"},
          {"layers.{i}.mlp.proj.weight", "transformer.h.{i}.mlp.c_proj.weight", "blk.{i}.ffn_down.weight", {.hf = kT}},
          {"layers.{i}.mlp.proj.bias", "transformer.h.{i}.mlp.c_proj.bias", "blk.{i}.ffn_down.bias"},
          {"ln_final.weight", "transformer.ln_f.weight", "output_norm.weight"},
          {"ln_final.bias", "transformer.ln_f.bias", "output_norm.bias"},
          {"lm_head.weight", "lm_head.weight", "output.weight", {.tied_to = "token_embeddings.weight"}},
      },
      // The causal-mask buffers older files carry, not weights.
      .hf_ignored = {"transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"},
      .hf_optional_prefix = "transformer.",  // OpenAI's released files have none
  };
  return t;
}

}  // namespace loom::gpt2
