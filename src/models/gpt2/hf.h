// Hugging Face GPT-2 directories (GPT2LMHeadModel, and OpenAI's released weights as in
// openai-community/gpt2): export a loom GPT-2 that transformers loads, and import such directories.
//
// Names: the family's table (names.cpp), each HF name with or without "transformer." on import. HF's
// Conv1D stores weights [in, out], so every matrix is transposed on the way; c_attn's out dimension holds
// q, k and v one after another. HF always has the q/k/v and output-projection biases: a loom model
// without them exports zero biases (same function) and imports back with them. The attn.bias and
// attn.masked_bias buffers older files carry are ignored. A tied head is absent from the file (or, if
// present, must equal wte). F32, F16 and BF16 weights, one file or shards.
//
// Refused on import, naming the option: activation_function other than gelu_new / gelu_pytorch_tanh,
// scale_attn_weights false, scale_attn_by_inverse_layer_idx, cross-attention.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/family.h"

namespace loom::gpt2 {

void export_hf(const models::LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir);
models::HfImport import_hf(const std::string& dir, const nlohmann::json& hf_config);

}  // namespace loom::gpt2
