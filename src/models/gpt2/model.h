// The GPT-2 language model (models/gpt2/config.h has the architecture).
//
// Legend: B batch, T sequence, C d_model, F d_ff, V vocab.
// Parameter names (Linear weights [out, in]):
//   token_embeddings.weight [V, C], position_embeddings.weight [context_length, C]
//   layers.{i}.ln1.{weight,bias}, layers.{i}.ln2.{weight,bias}                      [C]
//   layers.{i}.attn.{q,k,v}_proj.weight [C, C] (+ .bias [C] with qkv_bias)
//   layers.{i}.attn.output_proj.weight [C, C] (+ .bias [C] with output_proj_bias)
//   layers.{i}.mlp.fc.{weight [F, C], bias [F]}, layers.{i}.mlp.proj.{weight [C, F], bias [C]}
//   ln_final.{weight,bias}, lm_head.weight [V, C] (absent when tied)
// Initialisation (GPT-2 / nanoGPT): every matrix and embedding normal(0, 0.02), the two residual output
// projections (attn.output_proj, mlp.proj) normal(0, 0.02 / sqrt(2 * num_layers)), biases zero,
// LayerNorm gains one.
// Dropout (training only) at the sites of the GPT-2 code: after the embeddings' sum, on the attention
// probabilities, and on each residual branch before its add; the mask of a site is drawn from
// ctx.dropout_key folded with the layer and the site's name, so it depends on nothing else.
#pragma once

#include <memory>
#include <vector>

#include "nn/kv_cache.h"
#include "models/gpt2/config.h"
#include "models/model.h"
#include "nn/layers.h"

namespace loom::gpt2 {

// fc -> GELU (tanh) -> proj, with biases.
class Mlp : public nn::Module {
 public:
  Mlp(const std::string& name, const Config& c, RngKey key);
  Tensor forward(const Tensor& x) const;  // x: [..., C]
  nn::Linear fc, proj;
  // Mixed precision: gelu writes its output in bf16 for proj's bf16 GEMM (nn::mixed_output_dtype).
  bool bf16_output = false;
};

// x + drop(attn(ln1(x))), then + drop(mlp(ln2(.))).
class Block : public nn::Module {
 public:
  Block(const std::string& name, const Config& c, RngKey key);
  Tensor forward(const Tensor& x, const models::ForwardContext& ctx, int64_t layer, float dropout) const;
  Tensor forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache, int64_t layer) const;
  Tensor ln1_forward(const Tensor& x) const;  // ln1(x), in bf16 for the q, k, v GEMMs under mixed precision
  Tensor ln2_forward(const Tensor& h) const;  // ln2(h), in bf16 for fc's GEMM under mixed precision
  nn::LayerNorm ln1;
  nn::MultiHeadSelfAttention attn;
  nn::LayerNorm ln2;
  Mlp mlp;
};

class GPT2 : public models::LanguageModel {
 public:
  GPT2(const Config& config, uint64_t seed);

  // The final hidden states ln_final(...) [B, T, C].
  Tensor hidden(const Tensor& ids, const models::ForwardContext& ctx = {}) const;
  // The head's weight [V, C]: lm_head, or the token embedding when tied.
  Tensor head_weight() const;  // gathered when sharded (nn::compute_value)
  nn::Parameter& head_parameter() const;  // lm_head's weight, or the token embedding's when tied

  Tensor logits(const Tensor& ids, const models::ForwardContext& ctx = {}) const override;
  Tensor loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx = {}) const override;
  std::unique_ptr<nn::DecodeCache> make_decode_cache(int64_t batch) const override;
  Tensor decode(const Tensor& ids, nn::DecodeCache& cache) const override;
  // Batched serving's description: learned positions, LayerNorm, biases, GELU (tanh), the head tied or not.
  std::optional<nn::DecoderWeights> decoder_weights() const override;
  void set_matmul_precision(ops::MatmulPrecision precision) override;
  int64_t pipeline_layers() const override { return config_.num_layers; }
  Tensor stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids, const Tensor& targets,
                       const models::ForwardContext& ctx, Tensor* aux_loss) const override;
  // A tied token table is read by the first stage (the lookup) and the last (the head): 3.
  int pipeline_ends(const nn::Parameter& p) const override;

  const Config& config() const { return config_; }

  Config config_;
  nn::Embedding token_embeddings, position_embeddings;
  std::vector<std::unique_ptr<Block>> layers;
  nn::LayerNorm ln_final;
  std::unique_ptr<nn::Linear> lm_head;  // null when tied
  ops::MatmulPrecision head_precision = ops::MatmulPrecision::F32;

 private:
  // x = drop(wte[ids] + wpe[positions]): [B, t, C] for positions start..start+t-1.
  Tensor embed(const Tensor& ids, int64_t start, const models::ForwardContext& ctx) const;
};

}  // namespace loom::gpt2
