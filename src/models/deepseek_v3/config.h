// Configuration of the DeepSeek-V3 family (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"), shaped
// like the 190-line JAX model of shared/seeds/002 (its `Config` is the dsv3-mini preset):
//   * multi-head latent attention (MLA): queries through a low rank q_rank (RMSNorm'd), keys and values
//     through one latent c of size kv_rank (RMSNorm'd) plus one RoPE key of d_rope shared by all heads;
//     per head a query/key of d_nope + d_rope and a value of d_v;
//   * the first n_dense layers use a dense SwiGLU of d_ff; the others a DeepSeekMoE: n_shared always-on
//     SwiGLU experts (one SwiGLU of n_shared * d_expert, as the seed) plus n_routed routed experts of
//     d_expert, top_k per token by sigmoid affinity + a balancing bias (model state, not a parameter);
//   * aux-loss-free balancing: the bias moves by gamma * sign(mean load - load) after each step, plus the
//     sequence-wise balance loss weighted alpha_seq;
//   * n_mtp multi-token-prediction modules (each one dense block), their loss weighted mtp_lambda.
// Key names: loom's for what every family has (vocab_size, context_length, d_model, num_layers,
// num_heads), the seed's for the rest.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>

namespace loom::deepseek_v3 {

struct Config {
  int64_t vocab_size = 8192;
  int64_t context_length = 256;
  int64_t d_model = 384;
  int64_t num_layers = 6;
  int64_t n_dense = 1;        // the first n_dense layers use a dense SwiGLU instead of MoE
  int64_t num_heads = 6;
  int64_t q_rank = 192;       // MLA: query compression rank
  int64_t kv_rank = 128;      // MLA: the latent c (what the decode cache holds, with the RoPE key)
  int64_t d_nope = 32;        // per-head query/key dims without RoPE
  int64_t d_rope = 16;        // per-head query dims with RoPE, and the shared RoPE key's size
  int64_t d_v = 32;           // per-head value dims
  int64_t d_ff = 1024;        // dense SwiGLU hidden size (dense layers and MTP blocks)
  int64_t n_shared = 1;       // always-on shared experts
  int64_t n_routed = 16;      // routed experts
  int64_t top_k = 4;          // routed experts per token
  int64_t d_expert = 256;     // hidden size of each expert
  float route_scale = 1.0f;   // scale on the normalised gates
  float gamma = 1e-3f;        // bias update speed of aux-loss-free balancing
  float alpha_seq = 1e-4f;    // weight of the sequence-wise balance loss
  int64_t n_mtp = 1;          // multi-token prediction depth
  float mtp_lambda = 0.3f;    // weight of the MTP loss
  float rope_theta = 10000.0f;
  float init_std = 0.02f;     // every matrix and embedding normal(0, init_std); norm gains one
  float norm_eps = 1e-6f;     // the seed's rms_norm eps

  int64_t num_moe_layers() const { return num_layers - n_dense; }
  int64_t qk_head_dim() const { return d_nope + d_rope; }

  // Throws loom::Error naming the offending keys and values.
  void validate() const;
  // The config's `model` section ("arch": "deepseek_v3" and every key above), and back: from_json takes the
  // defaults above for missing keys, names unknown keys and wrong types, and validates.
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& model);

  // Parameter counts, from the shapes the model creates (the seed's n_params counts them all).
  int64_t attention_params() const;       // one MLA, its two norms included
  int64_t dense_block_params() const;     // attention + two block norms + dense SwiGLU
  int64_t moe_block_params() const;       // attention + two block norms + router + shared + routed
  int64_t routed_expert_params() const;   // one routed expert: 3 * d_model * d_expert
  int64_t mtp_module_params() const;      // two norms + 2d->d projection + a dense block
  int64_t total_params() const;
  // What one token's forward pass multiplies with: all but the embedding table and the MTP modules,
  // with top_k of the n_routed experts per MoE layer.
  int64_t active_params() const;
  // Floats the latent decode cache keeps per token: (kv_rank + d_rope) per layer.
  int64_t latent_cache_floats_per_layer() const { return kv_rank + d_rope; }
};

}  // namespace loom::deepseek_v3
