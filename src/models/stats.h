// Parameter counts and training FLOPs per token, per family (Family::stats), for `loom flops`, MFU and
// compute-optimal planning.
//
// Two estimates of training FLOPs per token:
//   * PaLM (Chowdhery et al. 2022, appendix B): 6N + 12·L·(H·D)·T, with N the parameters that take part
//     in a matrix multiply (all but lookup tables: token and learned position embeddings; a tied head is
//     a real matmul, so it counts) and 12·L·(H·D)·T the attention score and value matmuls (forward +
//     backward, full T×T as the paper counts them); plus the training-only modules a step runs
//     (DeepSeek-V3's MTP), the same way at the positions they run on.
//   * Chinchilla (Hoffmann et al. 2022, appendix F): the forward pass of one sequence term by term,
//     training = 3 × forward (backward = 2 × forward). Each term is an exact integer.
// Chinchilla-optimal data: about 20 tokens per parameter (Hoffmann et al. 2022, table 3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace loom::models {

// The Chinchilla appendix F terms for one forward pass over one sequence of T = context_length tokens.
// Exact integers (held in double, exact below 2^53).
struct ChinchillaForward {
  double embeddings = 0;         // 2·T·V·d
  double attention_qkv = 0;      // per layer: 2·T·d·(H·D + 2·Hkv·D)  (the paper: 2·3·T·d·(H·D))
  double attention_logits = 0;   // per layer: 2·T·T·(H·D)
  double attention_softmax = 0;  // per layer: 3·H·T·T
  double attention_reduce = 0;   // per layer: 2·T·T·(H·D)
  double attention_project = 0;  // per layer: 2·T·(H·D)·d
  double dense = 0;              // per layer: 2·T·(ffn_matrices·d·d_ff)
  double logits = 0;             // 2·T·d·V
  int64_t num_layers = 0;
  int64_t context_length = 0;

  double attention() const {
    return attention_qkv + attention_logits + attention_softmax + attention_reduce + attention_project;
  }
  double total() const {
    return embeddings + static_cast<double>(num_layers) * (attention() + dense) + logits;
  }
};

// The dense-transformer shape the Chinchilla formula reads.
struct ChinchillaShape {
  int64_t vocab_size, context_length, d_model, num_layers, num_heads, num_kv_heads, head_dim, d_ff;
  int ffn_matrices;  // 2 for a GELU MLP (the paper's), 3 for SwiGLU
};
ChinchillaForward chinchilla_forward(const ChinchillaShape& s);

struct ModelStats {
  std::string description;          // one line: the family's shape keys
  int64_t total_params = 0;
  int64_t lookup_params = 0;        // token (and position) embedding tables: no matmul
  int64_t matmul_params = 0;        // the N of 6N: total - lookup (+ V·d when the head is tied)
  int64_t attention_width = 0;      // H·D, for PaLM's attention term
  int64_t num_layers = 0;
  int64_t context_length = 0;
  ChinchillaForward chinchilla;     // per sequence
  std::string chinchilla_note;      // how the family's blocks map onto the paper's terms
  int64_t kv_cache_floats_per_token = 0;  // what decoding keeps per token, all layers
  std::string kv_cache_note;        // what those numbers are, when not plain per-head keys and values
  // Parameters one token's forward pass multiplies with, for sparse families (mixture of experts: the
  // routed experts a token does not pick, and training-only modules, left out); 0 for dense families.
  int64_t active_params = 0;
  // Training-only modules the step runs besides the model (DeepSeek-V3's multi-token prediction; 0
  // elsewhere): module k = 1..training_modules runs on the first T - k positions of each sequence,
  // through training_module_matmul_params weights (its own and the head it shares) and one attention
  // layer of attention_width. Not in matmul_params, which is what inference multiplies with.
  int64_t training_modules = 0;
  int64_t training_module_matmul_params = 0;

  // The training step's model FLOPs per token of a batch of sequences of T tokens:
  // 6N + 12·L·(H·D)·T, plus each training-only module at the T - k positions it runs on,
  // (T - k)/T · (6·N_k + 12·(H·D)·(T - k)). No recomputation counted (PaLM's model FLOPs).
  double palm_flops_per_token() const { return palm_flops_per_token_at(static_cast<double>(context_length)); }
  double palm_flops_per_token_at(double T) const {
    return 6.0 * static_cast<double>(matmul_params) +
           12.0 * static_cast<double>(num_layers) * static_cast<double>(attention_width) * T +
           training_module_flops_per_token_at(T);
  }
  // The training-only modules' part of the above (0 without them).
  double training_module_flops_per_token_at(double T) const {
    double sum = 0;
    for (int64_t k = 1; k <= training_modules; ++k) {
      const double n = std::max(0.0, T - static_cast<double>(k));  // positions module k runs on
      sum += n / T * (6.0 * static_cast<double>(training_module_matmul_params) +
                      12.0 * static_cast<double>(attention_width) * n);
    }
    return sum;
  }
  // 3 × forward / T.
  double chinchilla_flops_per_token() const {
    return 3.0 * chinchilla.total() / static_cast<double>(context_length);
  }
};

// Exact training FLOPs of `tokens` tokens by Chinchilla's formula: 3 × forward-per-sequence × tokens / T,
// as a decimal string (it passes 2^63 for real runs), rounded down when T does not divide.
std::string chinchilla_train_flops_exact(const ModelStats& s, int64_t tokens);

// 20 tokens per parameter.
inline double chinchilla_optimal_tokens(int64_t params) { return 20.0 * static_cast<double>(params); }

}  // namespace loom::models
