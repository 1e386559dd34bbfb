// GGUF files of llama.cpp's "llama" architecture, read into and written from loom's Llama.
//
// Metadata (llama.cpp's keys -> loom's Config):
//   llama.block_count -> num_layers            llama.embedding_length -> d_model
//   llama.feed_forward_length -> d_ff          llama.attention.head_count -> num_heads
//   llama.attention.head_count_kv -> num_kv_heads (GQA; absent = head_count)
//   llama.rope.freq_base -> rope_theta (absent = 10000)     llama.context_length -> context_length
//   llama.attention.layer_norm_rms_epsilon -> norm_eps      vocabulary: llama.vocab_size, else the
//                                                           rows of token_embd.weight
// Refused, naming the key: rope scaling (llama.rope.scaling.type other than "none", or a factor other
// than 1, or a rope_freqs.weight tensor), partial rotary (llama.rope.dimension_count != head dim), a
// head dim other than d_model / heads (llama.attention.key_length / value_length), experts
// (llama.expert_count > 0: Mixtral-style files also say "llama").
//
// Tensors: the family's table (names.cpp); GGUF's ne = [in, out] is loom's [out, in] (the same bytes).
// No output.weight: the head is tied, lm_head = a copy of the embedding.
// RoPE: llama.cpp's converter permutes HF's q/k rows (rotate-half pairs (i, i + D/2)) into interleaved
// pairs (2i, 2i + 1) per head, and llama.cpp rotates adjacent pairs; loom's RoPE rotates the same adjacent
// pairs, so q/k rows are taken as they are (tests/models/llama checks this against transformers' logits).
// Every tensor is dequantized to f32 (quant::dequantize).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "models/family.h"
#include "models/llama/model.h"

namespace loom::llama {

// The GGUF name of a loom parameter.
std::string gguf_tensor_name(const std::string& loom_name);

Config config_from_gguf(const gguf::Header& h);
// With AlsoQuantized, every projection and the head whose tensor is Q8_0, Q4_0, Q4_1, Q4_K or Q6_K also
// holds it quantized (nn::Linear::set_quantized): inference then runs src/quant's integer kernels on the
// file's blocks; the f32 parameters are still there (export, training). With QuantizedOnly, those
// layers hold the blocks only (one copy, no interleaved one): their f32 weights are never built and
// their parameters are left empty ([0]), the blocks read in place from the file's mapping — a QLoRA base
// (train/finetune.h).
std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, models::GgufMatrices matrices,
                                                   std::vector<std::string>& notes);
void export_gguf(const models::LanguageModel& model, std::vector<gguf::KeyValue>& metadata,
                 std::vector<models::GgufTensorOut>& tensors);

}  // namespace loom::llama
