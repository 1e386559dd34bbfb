// The fused single-token decode step of a Llama-style decoder whose matrices are held quantized: one
// parallel region per token instead of one per op (backends/cpu/decode_step.h says why and how), with
// the op-by-op path's logits bit for bit. And its batched form over a paged cache (paged_decode_step,
// serving's step): the rows of many sequences in one region, bit for bit nn::paged_decoder_forward's.
//
// Legend: C d_model, H query heads, Hkv k/v heads, D head dim, F d_ff, V vocab, L layers, P the new
// token's position, cap a cache's capacity.
//
// It is prepared once and run per token: a model describes its weights (DecodeStepWeights) when they
// change, DecodeStep checks the description and lays it out for the kernel, and decode_step checks only
// what changes per token (the token, the position, the caches). CPU only: a tensor on another device is
// refused with backends/backend.h's unsupported-device error.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/paged_attention.h"
#include "ops/rope.h"
#include "quant/qmatmul.h"

namespace loom::cpu {
struct DecodeModel;
}

namespace loom::ops {

// One pre-norm block: RMSNorm, attention with RoPE on q and k (grouped-query), the residual add;
// RMSNorm, SwiGLU, the residual add. No biases.
struct DecodeStepLayer {
  std::shared_ptr<const quant::QuantizedMatrix> q_proj;       // [H*D, C]
  std::shared_ptr<const quant::QuantizedMatrix> k_proj;       // [Hkv*D, C]
  std::shared_ptr<const quant::QuantizedMatrix> v_proj;       // [Hkv*D, C]
  std::shared_ptr<const quant::QuantizedMatrix> output_proj;  // [C, H*D]
  std::shared_ptr<const quant::QuantizedMatrix> w1, w3;       // [F, C] gate, up
  std::shared_ptr<const quant::QuantizedMatrix> w2;           // [C, F] down
  Tensor attn_norm, ffn_norm;                                 // f32 [C] gains
  float attn_norm_eps = 1e-5f, ffn_norm_eps = 1e-5f;
  RopeCache rope;                                             // cos, sin: f32 [>= context_length, D/2]
  RopeStyle rope_style = RopeStyle::Interleaved;
};

// A whole decoder, batch 1: token embeddings, L blocks, the final RMSNorm and the head.
struct DecodeStepWeights {
  int64_t num_heads = 0, num_kv_heads = 0;  // H, Hkv
  int64_t context_length = 0;               // positions [0, context_length) may be decoded
  Tensor token_embeddings;                  // f32 [V, C]
  std::vector<DecodeStepLayer> layers;
  Tensor final_norm;                        // f32 [C]
  float final_norm_eps = 1e-5f;
  std::shared_ptr<const quant::QuantizedMatrix> head;  // [V, C]
};

// A decode step checked and laid out once: it keeps the weights (their tensors and matrices stay alive
// with it) and the kernel's description of them.
class DecodeStep {
 public:
  // "" when the kernel can run these weights, else why not: a head dim that is not a multiple of 8 (the
  // kernels' row groups), a matrix of a type without integer kernels. A model then decodes op by op.
  static std::string unsupported(const DecodeStepWeights& weights);
  // Checks the description: every shape against H, Hkv and the embeddings' [V, C], f32 CPU tensors, RoPE
  // tables covering context_length, and unsupported() empty; errors name the offending value.
  explicit DecodeStep(DecodeStepWeights weights);
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  const DecodeStepWeights& weights() const { return weights_; }
  int64_t head_dim() const;
  int64_t vocab_size() const { return weights_.token_embeddings.size(0); }

 private:
  friend Tensor decode_step(const DecodeStep&, int32_t, int64_t, const std::vector<Tensor>&, const std::vector<Tensor>&);
  friend Tensor paged_decode_step(const DecodeStep&, std::span<const int32_t>, const PagedRows&,
                                  std::span<const int64_t>, const std::vector<Tensor>&, const std::vector<Tensor>&);
  DecodeStepWeights weights_;
  std::unique_ptr<const cpu::DecodeModel> kernel_;
};

// One token at `position` (the number of tokens the caches hold): returns its logits f32 [1, 1, V] and
// writes its rotated key and value to row `position` of every layer's cache; the caller advances its
// cache. k_cache[l], v_cache[l]: layer l's f32 [1, Hkv, cap, D] on the CPU. Refuses, by value, a token
// outside [0, V), a position past context_length or the caches' capacity, and caches of another shape.
Tensor decode_step(const DecodeStep& step, int32_t token, int64_t position, const std::vector<Tensor>& k_cache,
                   const std::vector<Tensor>& v_cache);

// The same step over the rows of many sequences at once, their keys and values in paged caches (batched
// serving): row r is tokens[r] at rows.positions[r] of the sequence whose blocks rows.tables[r] lists.
// Writes every row's rotated key and value to its slot of k_cache[l], v_cache[l] (f32 [NB, Hkv, S, D] on
// the CPU) and returns the logits f32 [n, V] of rows logit_rows[0..n) (distinct, in [0, R)). A row's
// logits and cache entries are bitwise those of the op-by-op paged pass (nn::paged_decoder_forward:
// RMSNorm, quantized_matmul, ops::rope, ops::paged_attention, SwiGLU, adds), whatever the other rows
// (backends/cpu/decode_step.h). Refuses, by value, a token outside [0, V), a position past
// context_length, a block outside the caches, caches of another shape, a logit row out of range.
Tensor paged_decode_step(const DecodeStep& step, std::span<const int32_t> tokens, const PagedRows& rows,
                         std::span<const int64_t> logit_rows, const std::vector<Tensor>& k_cache,
                         const std::vector<Tensor>& v_cache);

}  // namespace loom::ops
