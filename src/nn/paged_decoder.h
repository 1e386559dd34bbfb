// A decoder run over the rows of many sequences at once, each sequence's keys and values (or latents) in
// fixed-size blocks of a shared cache: the forward pass of batched serving (src/serve/). A model describes
// its weights once (models::LanguageModel::decoder_weights); every decode step then runs all active
// sequences through one pass over those weights. One description covers the three families:
//   * Llama: RMSNorm, attention with RoPE (grouped-query), SwiGLU, no biases;
//   * GPT-2: learned positions added to the embedding, LayerNorm (with bias), attention without RoPE,
//     biases on the linear layers, a GELU (tanh) MLP, the head tied to the embedding or not;
//   * DeepSeek-V3: multi-head latent attention (MLA) over a cache of latents [c | k_rope], one slot per
//     position (the absorbed form: queries folded into latent space, values read from c, W_UV folded
//     into the output projection), and dense SwiGLU or mixture-of-experts layers (shared experts plus
//     routed ones: each row routed on its own, the rows grouped per expert).
//
// Legend: R rows of a step (tokens of any number of sequences), C d_model, H heads, Hkv k/v heads,
// D head dim, F d_ff, V vocab, S block size, NB blocks, L layers; MLA: Q q_rank, Rk kv_rank, N d_nope,
// P d_rope; MoE: E routed experts, K per row.
//
// Batch invariance, the promise serving builds on: every operation here is row-wise (embedding, norms,
// RoPE at the row's own position, ops::row_linear or the quantized matmul, biases, activations, routing
// and each expert's products, residual adds), except attention, which reads the row's own sequence's
// cache (ops::paged_attention). A row's routed experts are summed in its own top-k order, so which other
// rows an expert serves in the step changes nothing. So a token's logits, and the keys and values it
// leaves in the cache, are a function of its sequence's tokens alone: bitwise the same whatever other
// sequences share the step, in whatever order, however the sequence's prompt was cut into chunks, and
// whatever the thread count. (tests/serve and tests/models/llama check it; the quantized matmul is
// row-wise because it quantizes each activation row on its own and sums each output in one order for
// any M.)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/layers.h"
#include "ops/decode_step.h"
#include "ops/paged_attention.h"
#include "ops/rope.h"
#include "quant/qmatmul.h"

namespace loom::nn {

// A linear layer's weight [N, K] (out, in): f32, or held quantized; exactly one is set. And its bias
// f32 [N], or none.
struct DecoderMatrix {
  Tensor f32;
  std::shared_ptr<const quant::QuantizedMatrix> quantized;
  Tensor bias;
  int64_t rows() const { return quantized ? quantized->rows() : f32.size(0); }
  int64_t cols() const { return quantized ? quantized->cols() : f32.size(1); }
  bool defined() const { return quantized != nullptr || f32.defined(); }
  // x: f32 [M, K] -> [M, N] (+ bias), each row computed alone (ops::row_linear or quantized_matmul).
  Tensor apply(const Tensor& x) const;
};

// How the blocks normalise: RMSNorm (gain) or LayerNorm (gain and bias, PyTorch's).
enum class DecoderNorm { RMS, Layer };
// The feed-forward part of a block: w2(silu(w1 x) * w3 x); w2(gelu_tanh(w1 x + b1)) + b2 (GPT-2's
// fc and proj); or a mixture of experts (`moe`).
enum class DecoderFfn { SwiGLU, GeluTanh, MoE };

// Multi-head latent attention in the absorbed form (models/deepseek_v3/mla.h has the math): per row
//   q = wq_b(q_norm(wq_a x)) -> per head [q_nope N | q_rope P], q_rope rotated;
//   [c | k_rope] = wkv_a x, c = kv_norm(c), k_rope rotated: the row's cache slot [Rk + P];
//   per head q_abs = W_UK[h] q_nope [Rk]; attention of [q_abs | q_rope] over the slots with the scale
//   1/sqrt(N + P), values the slots' c: o [H, Rk]; out = wo_abs o, wo_abs = wo with W_UV folded in.
struct LatentAttentionWeights {
  int64_t q_rank = 0, kv_rank = 0, d_nope = 0, d_rope = 0;  // Q, Rk, N, P
  DecoderMatrix wq_a;   // [Q, C]
  Tensor q_norm;        // f32 [Q]
  float q_norm_eps = 1e-6f;
  DecoderMatrix wq_b;   // [H*(N+P), Q]
  DecoderMatrix wkv_a;  // [Rk+P, C]
  Tensor kv_norm;       // f32 [Rk]
  float kv_norm_eps = 1e-6f;
  std::vector<DecoderMatrix> w_uk;  // per head [Rk, N]: q_abs = W_UK[h] q_nope (wkv_b's k_nope rows, transposed)
  DecoderMatrix wo_abs;             // [C, H*Rk]
  float scale = 0;                  // the scores' scale, 1/sqrt(N + P) (the model's)
  ops::RopeCache rope;              // [>= context_length, P/2], RotateHalf
};

// A mixture of experts: shared experts (one SwiGLU, always on) plus routed ones; each row takes the
// top_k experts by sigmoid(router x) + bias, weighted by their normalised affinities times route_scale
// (ops::moe_route).
struct MoeWeights {
  DecoderMatrix router;  // [E, C]
  Tensor bias;           // f32 [E]: selection only
  int64_t top_k = 1;
  float route_scale = 1.0f;
  std::vector<DecoderMatrix> w1, w3, w2;  // per expert [F, C], [F, C], [C, F]
  DecoderMatrix shared_w1, shared_w3, shared_w2;  // undefined without shared experts
};

// One block: norm, attention, residual; norm, feed-forward, residual.
struct DecoderLayerWeights {
  DecoderMatrix q_proj, k_proj, v_proj, output_proj;  // [H*D, C], [Hkv*D, C] x2, [C, H*D]; not with MLA
  DecoderMatrix w1, w3, w2;                           // [F, C] gate, up; [C, F] down (GELU: fc, -, proj)
  Tensor attn_norm, ffn_norm;                         // f32 [C]
  Tensor attn_norm_bias, ffn_norm_bias;               // f32 [C], LayerNorm only
  float attn_norm_eps = 1e-5f, ffn_norm_eps = 1e-5f;
  ops::RopeCache rope;  // cos, sin [>= context_length, D/2]; undefined: no RoPE (learned positions)
  ops::RopeStyle rope_style = ops::RopeStyle::Interleaved;
  std::optional<LatentAttentionWeights> mla;  // set: the attention is MLA (q/k/v/output_proj unused)
  DecoderFfn ffn = DecoderFfn::SwiGLU;
  std::optional<MoeWeights> moe;              // the experts, when ffn is MoE
};

struct DecoderWeights {
  int64_t num_heads = 0, num_kv_heads = 0, context_length = 0;  // MLA: num_kv_heads 1 (one latent slot)
  Tensor token_embeddings;  // f32 [V, C]
  Tensor position_embeddings;  // f32 [>= context_length, C], added to the token's: learned positions (GPT-2)
  DecoderNorm norm = DecoderNorm::RMS;
  std::vector<DecoderLayerWeights> layers;
  Tensor final_norm;  // f32 [C]
  Tensor final_norm_bias;  // f32 [C], LayerNorm only
  float final_norm_eps = 1e-5f;
  DecoderMatrix head;  // [V, C]

  // The same pass fused into one parallel region per step (ops::paged_decode_step), set by fuse() when
  // every matrix is held quantized with integer kernels: run op by op, a small model's step is hundreds
  // of parallel regions, each forking and joining the threads, which costs more than the arithmetic at
  // a few rows. Bitwise the op-by-op pass's logits and cache entries (tests/models/llama).
  std::shared_ptr<const ops::DecodeStep> fused;

  int64_t d_model() const { return token_embeddings.size(1); }
  int64_t vocab_size() const { return token_embeddings.size(0); }
  int64_t head_dim() const { return d_model() / num_heads; }
  // The paged cache's shape: num_kv_heads slots of cache_head_dim() numbers per position and layer,
  // keys and values (cache_values()), or one latent [c | k_rope] that serves as both (MLA).
  bool latent() const { return !layers.empty() && layers[0].mla.has_value(); }
  int64_t cache_head_dim() const;
  bool cache_values() const { return !latent(); }
  // Throws loom::Error naming the first shape, dtype or device that does not fit.
  void check() const;
  // Sets `fused` when the weights allow it and returns ""; else leaves it empty and returns why not
  // (an f32 matrix, a head dim that is not a multiple of 8, ...).
  std::string fuse();
};

// The keys and values of every layer in NB blocks of S positions: k[l], v[l] f32 [NB, Hkv, S, D]. Without
// `values` (a latent cache, MLA) v[l] is k[l]: one tensor whose slots are both.
class PagedKVCache {
 public:
  PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t kv_heads, int64_t block_size, int64_t head_dim,
               bool values = true);
  // The cache a decoder's weights need (DecoderWeights::cache_head_dim, cache_values).
  PagedKVCache(const DecoderWeights& w, int64_t num_blocks, int64_t block_size);
  // Bytes one block takes over all layers (keys and values, or latents).
  static int64_t block_bytes(int64_t num_layers, int64_t kv_heads, int64_t block_size, int64_t head_dim,
                             bool values = true);
  static int64_t block_bytes(const DecoderWeights& w, int64_t block_size);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Copies positions [0, count) of block `from` into block `to`, every layer and head, keys and values:
  // a new sequence whose tokens start like those `from` holds takes their entries (serve's prefix
  // cache, to the token); they are bitwise what computing them again would write.
  void copy_positions(int64_t from, int64_t to, int64_t count);
  std::vector<Tensor> k, v;

 private:
  int64_t num_blocks_, block_size_;
  bool values_;
};

// What a sequence brings to a step: tokens[i] at position start + i, its block table covering
// positions up to start + tokens.size() - 1, and whether the step should return the last token's logits.
struct DecoderBatchItem {
  const std::vector<int32_t>* table = nullptr;
  int64_t start = 0;
  std::span<const int32_t> tokens;
  bool logits = true;
};

// A model's layers as the description's parts, or why they cannot be: "" and `out` set, else the reason
// naming the parameter (sharded over a mesh, a LoRA adapter, a weight type without kernels, not f32 on the
// CPU). A Linear's weight f32 or held quantized, with its bias when it has one.
std::string describe_linear(const Linear& l, DecoderMatrix& out);
// A plain f32 CPU tensor (an embedding, a norm's gain or bias).
std::string describe_plain(const Parameter& p, Tensor& out);

// Writes the items' keys and values to their blocks and returns the logits f32 [n, V] of the last
// token of each item with `logits` set, in item order. Runs w.fused when set, else op by op.
Tensor paged_decoder_forward(const DecoderWeights& w, PagedKVCache& cache, const std::vector<DecoderBatchItem>& items);

}  // namespace loom::nn
