// GGUF files of llama.cpp's "gpt2" architecture, read into and written from loom's GPT-2.
//
// Metadata (llama.cpp's keys <-> loom's Config):
//   gpt2.block_count <-> num_layers              gpt2.embedding_length <-> d_model
//   gpt2.feed_forward_length <-> ffn_dim()       gpt2.attention.head_count <-> num_heads
//   gpt2.context_length <-> context_length       gpt2.attention.layer_norm_epsilon <-> norm_eps
//   vocabulary: gpt2.vocab_size, else the rows of token_embd.weight
//
// Tensors: the family's table (names.cpp); GGUF's ne = [in, out] is loom's [out, in] (the same bytes),
// q, k and v stacked on the output dim into attn_qkv (q first). output.weight only when untied.
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
std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, models::GgufMatrices matrices,
                                                   std::vector<std::string>& notes);
void export_gguf(const models::LanguageModel& model, std::vector<gguf::KeyValue>& metadata,
                 std::vector<models::GgufTensorOut>& tensors);

}  // namespace loom::gpt2
