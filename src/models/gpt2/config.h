// Configuration of the GPT-2 family (Radford et al. 2019; OpenAI's released layout): learned position
// embeddings, pre-LN blocks with LayerNorm (with bias), causal multi-head attention, a GELU (tanh) MLP
// with biases, a final LayerNorm, and an LM head tied to the token embedding or not.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>

namespace loom::gpt2 {

struct Config {
  int64_t vocab_size = 50257;
  int64_t context_length = 1024;  // learned positions: the model cannot run past it
  int64_t d_model = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t d_ff = 0;               // MLP hidden size; 0 means 4 * d_model
  float norm_eps = 1e-5f;
  bool qkv_bias = true;           // biases on q, k, v (OpenAI's GPT-2 has them)
  bool output_proj_bias = true;   // bias on the attention output projection
  bool tie_embeddings = true;     // lm_head = token_embeddings (OpenAI's layout)
  float dropout = 0.0f;           // on embeddings, attention probabilities and each residual branch

  int64_t head_dim() const { return d_model / num_heads; }
  int64_t ffn_dim() const { return d_ff == 0 ? 4 * d_model : d_ff; }

  // Throws loom::Error naming the offending key and value.
  void validate() const;
  // The config's `model` section ("arch": "gpt2" and every key above), and back: from_json takes the
  // defaults above for missing keys, names unknown keys and wrong types, and validates.
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& model);

  // Parameter counts, from the shapes the model creates.
  int64_t params_per_layer() const;
  int64_t total_params() const;
};

}  // namespace loom::gpt2
