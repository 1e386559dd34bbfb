// The Llama-style TransformerLM (CS336 assignment 1): token embeddings, pre-norm blocks with RoPE
// attention and SwiGLU, a final RMSNorm and an untied lm_head.
//
// Parameter names are the CS336 state-dict names: token_embeddings.weight,
// layers.{i}.attn.{q,k,v,output}_proj.weight, layers.{i}.ln{1,2}.weight, layers.{i}.ffn.{w1,w2,w3}.weight,
// ln_final.weight, lm_head.weight.
#pragma once

#include <memory>
#include <vector>

#include "nn/kv_cache.h"
#include "models/llama/config.h"
#include "models/llama/fused_decode.h"
#include "models/model.h"
#include "nn/layers.h"

namespace loom::llama {

class TransformerLM : public models::LanguageModel {
 public:
  // Draws every parameter from RngKey::from_seed(seed).fold_in(name).
  TransformerLM(const Config& config, uint64_t seed);

  // ids: i32 [B, T] with T <= context_length; positions: i32 [T] or [B, T] (default 0..T-1).
  // Returns logits [B, T, V].
  Tensor forward(const Tensor& ids, const Tensor& positions = Tensor()) const;
  // The final hidden states ln_final(...) [B, T, C]: forward() without the lm_head. bf16 under
  // MatmulPrecision::BF16 (ln_final rounds its output for the head's bf16 GEMM), else f32.
  Tensor hidden(const Tensor& ids, const Tensor& positions = Tensor(), const models::ForwardContext& ctx = {}) const;
  // Incremental decoding: ids [B, t] are the next t tokens after the cache's contents; returns their
  // logits [B, t, V] and appends their keys/values to `cache`. Runs without autodiff.
  // last_only: the head over the last position only ([B, 1, V]).
  Tensor forward_cached(const Tensor& ids, nn::KVCache& cache, bool last_only = false) const;
  // A cache sized for this model: capacity context_length.
  nn::KVCache make_cache(int64_t batch) const;

  // models::LanguageModel. The Llama has no dropout: ctx changes nothing.
  Tensor logits(const Tensor& ids, const models::ForwardContext& ctx = {}) const override;
  // Mean next-token cross-entropy through ops::linear_cross_entropy: the [B, T, V] logits and their
  // gradient are never materialised.
  Tensor loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx = {}) const override;
  std::unique_ptr<nn::DecodeCache> make_decode_cache(int64_t batch) const override;
  Tensor decode(const Tensor& ids, nn::DecodeCache& cache) const override;
  // The head over the last position only.
  Tensor decode_last(const Tensor& ids, nn::DecodeCache& cache) const override;
  void set_matmul_precision(ops::MatmulPrecision precision) override;
  int64_t pipeline_layers() const override { return config_.num_layers; }
  Tensor stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids, const Tensor& targets,
                       const models::ForwardContext& ctx, Tensor* aux_loss) const override;
  // Every Linear f32 (CPU, unsharded) or held quantized with kernels, no biases, RoPE: see fused_decode.h's
  // decoder_weights_of for the reasons it says no.
  std::optional<nn::DecoderWeights> decoder_weights() const override;

  const Config& config() const { return config_; }

  // Single-token decoding (forward_cached with B = 1, t = 1) of a model whose Linear layers are all held
  // quantized runs fused_decode_step (ops/decode_step.h): one parallel region per token instead of one
  // per op. false takes the op-by-op path, the reference the fused step is tested against.
  bool fused_decode = true;
  // Whether the fused step can run this model: "" when it can, else why not (models/llama/fused_decode.h).
  // Decided when the model is built and again whenever its layers change (a Linear quantized or not, the
  // parameters sharded: nn::Module::layers_changed), not per token.
  const std::string& fused_decode_unsupported() const { return fused_.unsupported; }
  // The prepared step (null when unsupported): the same object from one change of the layers to the next.
  const ops::DecodeStep* fused_decode_plan() const { return fused_.step.get(); }
  // One token at position P = cache.length() (batch 1) by the fused step: returns its logits [1, 1, V]
  // and writes its keys and values to the cache's row P of every layer; the caller advances the cache.
  // Refuses a bad token, a full cache, or a model the step cannot run, naming the value or the reason.
  Tensor fused_decode_step(int32_t token, nn::KVCache& cache) const;

  Config config_;
  nn::Embedding token_embeddings;
  std::vector<std::unique_ptr<nn::TransformerBlock>> layers;
  nn::RMSNorm ln_final;
  nn::Linear lm_head;

 protected:
  void on_layers_changed() override;

 private:
  Tensor default_positions(int64_t T) const;
  mutable Tensor positions_cache_;  // i32 [context_length] = 0..context_length-1
  FusedDecodePlan fused_;           // plan_fused_decode's, rebuilt by on_layers_changed
};

}  // namespace loom::llama
