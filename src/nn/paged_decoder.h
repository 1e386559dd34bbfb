// A pre-norm RoPE/SwiGLU decoder (the Llama family's shape) run over the rows of many sequences at once,
// each sequence's keys and values in fixed-size blocks of a shared cache: the forward pass of batched
// serving (src/serve/). A model describes its weights once (models::LanguageModel::decoder_weights);
// every decode step then runs all active sequences through one pass over those weights.
//
// Legend: R rows of a step (tokens of any number of sequences), C d_model, H heads, Hkv k/v heads,
// D head dim, F d_ff, V vocab, S block size, NB blocks, L layers.
//
// Batch invariance, the promise serving builds on: every operation here is row-wise (embedding, RMSNorm,
// RoPE at the row's own position, ops::row_linear or the quantized matmul, SwiGLU, residual adds), except
// attention, which reads the row's own sequence's cache (ops::paged_attention). So a token's logits, and
// the keys and values it leaves in the cache, are a function of its sequence's tokens alone: bitwise the
// same whatever other sequences share the step, in whatever order, however the sequence's prompt was cut
// into chunks, and whatever the thread count. (tests/serve checks it; the quantized matmul is row-wise
// because it quantizes each activation row on its own and sums each output in one order for any M.)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/decode_step.h"
#include "ops/paged_attention.h"
#include "ops/rope.h"
#include "quant/qmatmul.h"

namespace loom::nn {

// A linear layer's weight [N, K] (out, in): f32, or held quantized; exactly one is set.
struct DecoderMatrix {
  Tensor f32;
  std::shared_ptr<const quant::QuantizedMatrix> quantized;
  int64_t rows() const { return quantized ? quantized->rows() : f32.size(0); }
  int64_t cols() const { return quantized ? quantized->cols() : f32.size(1); }
  // x: f32 [M, K] -> [M, N], each row computed alone (ops::row_linear or quantized_matmul).
  Tensor apply(const Tensor& x) const;
};

// One block: RMSNorm, attention (RoPE on q and k, grouped-query), residual; RMSNorm, SwiGLU, residual.
struct DecoderLayerWeights {
  DecoderMatrix q_proj, k_proj, v_proj, output_proj;  // [H*D, C], [Hkv*D, C] x2, [C, H*D]
  DecoderMatrix w1, w3, w2;                           // [F, C] gate, up; [C, F] down
  Tensor attn_norm, ffn_norm;                         // f32 [C]
  float attn_norm_eps = 1e-5f, ffn_norm_eps = 1e-5f;
  ops::RopeCache rope;  // cos, sin [>= context_length, D/2]
  ops::RopeStyle rope_style = ops::RopeStyle::Interleaved;
};

struct DecoderWeights {
  int64_t num_heads = 0, num_kv_heads = 0, context_length = 0;
  Tensor token_embeddings;  // f32 [V, C]
  std::vector<DecoderLayerWeights> layers;
  Tensor final_norm;  // f32 [C]
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
  // Throws loom::Error naming the first shape, dtype or device that does not fit.
  void check() const;
  // Sets `fused` when the weights allow it and returns ""; else leaves it empty and returns why not
  // (an f32 matrix, a head dim that is not a multiple of 8, ...).
  std::string fuse();
};

// The keys and values of every layer in NB blocks of S positions: k[l], v[l] f32 [NB, Hkv, S, D].
class PagedKVCache {
 public:
  PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t kv_heads, int64_t block_size, int64_t head_dim);
  // Bytes one block takes over all layers (keys and values).
  static int64_t block_bytes(int64_t num_layers, int64_t kv_heads, int64_t block_size, int64_t head_dim);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  std::vector<Tensor> k, v;

 private:
  int64_t num_blocks_, block_size_;
};

// What a sequence brings to a step: tokens[i] at position start + i, its block table covering
// positions up to start + tokens.size() - 1, and whether the step should return the last token's logits.
struct DecoderBatchItem {
  const std::vector<int32_t>* table = nullptr;
  int64_t start = 0;
  std::span<const int32_t> tokens;
  bool logits = true;
};

// Writes the items' keys and values to their blocks and returns the logits f32 [n, V] of the last
// token of each item with `logits` set, in item order. Runs w.fused when set, else op by op.
Tensor paged_decoder_forward(const DecoderWeights& w, PagedKVCache& cache, const std::vector<DecoderBatchItem>& items);

}  // namespace loom::nn
