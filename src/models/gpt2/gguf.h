// GGUF files of llama.cpp's "gpt2" architecture, read into and written from loom's GPT-2.
//
// Metadata (llama.cpp's keys <-> loom's Config):
//   gpt2.block_count <-> num_layers              gpt2.embedding_length <-> d_model
//   gpt2.feed_forward_length <-> ffn_dim()       gpt2.attention.head_count <-> num_heads
//   gpt2.context_length <-> context_length       gpt2.attention.layer_norm_epsilon <-> norm_eps
//   vocabulary: gpt2.vocab_size, else the rows of token_embd.weight
//
// Tensors (GGUF <-> loom), with GGUF's ne = [in, out] = loom's [out, in] (the same bytes):
//   token_embd.weight [V, C]              token_embeddings.weight
//   position_embd.weight [T, C]           position_embeddings.weight
//   blk.N.attn_norm / ffn_norm .{weight,bias}   layers.N.ln1 / ln2 .{weight,bias}
//   blk.N.attn_qkv.weight [3C, C]         layers.N.attn.{q,k,v}_proj.weight stacked on the output dim (q first)
//   blk.N.attn_qkv.bias [3C]              layers.N.attn.{q,k,v}_proj.bias, stacked the same way
//   blk.N.attn_output.{weight,bias}       layers.N.attn.output_proj.{weight,bias}
//   blk.N.ffn_up.{weight,bias} [F, C]     layers.N.mlp.fc.{weight,bias}
//   blk.N.ffn_down.{weight,bias} [C, F]   layers.N.mlp.proj.{weight,bias}
//   output_norm.{weight,bias}             ln_final.{weight,bias}
//   output.weight [V, C]                  lm_head.weight (written only when untied; absent = tied)
// llama.cpp's gpt2 requires the qkv and attention-output biases: a loom model without them
// (model.qkv_bias / model.output_proj_bias = false) is written with zero biases, which computes the same
// function; imports always have them. Every tensor is dequantized to f32 on import.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "models/family.h"
#include "models/gpt2/config.h"

namespace loom::gpt2 {

Config config_from_gguf(const gguf::Header& h);
std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, bool quantized,
                                                   std::vector<std::string>& notes);
void export_gguf(const models::LanguageModel& model, std::vector<gguf::KeyValue>& metadata,
                 std::vector<models::GgufTensorOut>& tensors);

}  // namespace loom::gpt2
