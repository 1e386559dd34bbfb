// Configuration of the Llama-style TransformerLM (the CS336 assignment's model): RMSNorm, SwiGLU,
// RoPE, pre-norm blocks, untied lm_head, no biases.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/error.h"

namespace loom::llama {

struct Config {
  int64_t vocab_size = 10000;
  int64_t context_length = 256;
  int64_t d_model = 512;
  int64_t num_layers = 4;
  int64_t num_heads = 16;
  // Grouped-query attention: heads of k and v, each shared by num_heads / num_kv_heads query heads
  // (as HF Llama's num_key_value_heads). 0 means num_heads: ordinary multi-head attention.
  int64_t num_kv_heads = 0;
  int64_t d_ff = 1344;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;

  int64_t head_dim() const { return d_model / num_heads; }
  int64_t kv_heads() const { return num_kv_heads == 0 ? num_heads : num_kv_heads; }

  // Throws loom::Error naming the offending values.
  void validate() const;

  // The config's `model` section ("arch": "llama" and every key above), and back: from_json takes the
  // defaults above for missing keys, names unknown keys and wrong types, and validates.
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& model);

  // Parameter counts, from the shapes the model creates.
  int64_t embedding_params() const { return vocab_size * d_model; }
  // q and output projections [C, C], k and v [Hkv*D, C], SwiGLU, two norm gains.
  int64_t params_per_layer() const {
    return 2 * d_model * d_model + 2 * kv_heads() * head_dim() * d_model + 3 * d_model * d_ff + 2 * d_model;
  }
  // All parameters: embeddings + layers + final norm + lm_head.
  int64_t total_params() const {
    return embedding_params() + num_layers * params_per_layer() + d_model + vocab_size * d_model;
  }
  // Everything but the token embedding table (the lm_head's matmul is real compute, so it counts).
  int64_t non_embedding_params() const { return total_params() - embedding_params(); }
};

}  // namespace loom::llama
