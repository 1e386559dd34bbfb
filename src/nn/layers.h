// The building blocks shared by the model families, mirroring the CS336 / JAX-LM modules.
//
// Legend: B batch, T sequence, C d_model, F d_ff, H heads, D head dim, V vocab.
// Every module takes its dotted name prefix and an RngKey; parameter i is drawn from
// key.fold_in(parameter name), so initial weights do not depend on construction order.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "nn/kv_cache.h"
#include "nn/lora.h"
#include "nn/parameter.h"
#include "ops/attention.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "quant/qmatmul.h"

namespace loom::nn {

// y = x W^T (+ b). weight: [out, in], by default truncated normal std sqrt(2/(in+out)) cut at +-3 std
// (CS336); bias: [out], zeros.
class Linear : public Module {
 public:
  Linear(const std::string& name, int64_t in_features, int64_t out_features, RngKey key);
  Linear(const std::string& name, int64_t in_features, int64_t out_features, RngKey key, const Init& init, bool bias);
  // CS336's init: truncated normal, std sqrt(2/(in+out)), cut at +-3 std.
  static Init default_init(int64_t in_features, int64_t out_features);
  Tensor forward(const Tensor& x) const;  // x: [..., in] -> [..., out]
  // forward without the LoRA adapter: the base layer alone.
  Tensor base_forward(const Tensor& x) const;
  // Holds the weight quantized (GGUF import): forward then multiplies by it and does not read
  // weight.value, with the integer kernels of quant/qmatmul.h, or, when autodiff records a backward pass
  // through x (LoRA on a quantized base), by its dequantized tiles (ops::dequantized_linear). The weight
  // itself is never trained: a forward that would record its gradient is refused, naming the layer.
  // q must be [out, in] of a type with kernels; nullptr clears it.
  void set_quantized(std::shared_ptr<const quant::QuantizedMatrix> q);
  // LoRA (nn/lora.h): forward adds the adapter's update to the base layer's output. The adapter becomes
  // this layer's child (its parameters follow the weight's in parameters()); at most one per layer.
  LoRA& attach_lora(const LoraOptions& options, RngKey key);
  // Removes the adapter (after merging it, or to run the base layer alone); returns it.
  std::unique_ptr<LoRA> detach_lora();
  // The layer's name: the weight's without ".weight" ("layers.0.attn.q_proj").
  std::string name() const;
  Parameter& weight;
  Parameter* bias = nullptr;  // absent without a bias
  ops::MatmulPrecision precision = ops::MatmulPrecision::F32;
  std::shared_ptr<const quant::QuantizedMatrix> quantized;  // set_quantized's, or null
  // With `quantized`: multiply by its dequantized values a tile at a time (ops::dequantized_linear) even
  // when nothing records a backward pass: exact against the dequantized weights, as a fine-tuning run
  // evaluates the layers it trains through (QLoRA). Off: the integer kernels, for decoding speed.
  bool dequantized_matmul = false;
  std::unique_ptr<LoRA> lora;                               // attach_lora's, or null
};

// weight: [V, C], by default truncated normal std 1 cut at +-3 (CS336).
class Embedding : public Module {
 public:
  Embedding(const std::string& name, int64_t num_embeddings, int64_t dim, RngKey key);
  Embedding(const std::string& name, int64_t num_embeddings, int64_t dim, RngKey key, const Init& init,
            ParamGroup group);
  Tensor forward(const Tensor& ids) const;  // ids: i32 [...] -> [..., C]
  Parameter& weight;
  // The table held in a GGUF block format instead (QLoRA's import, models::GgufMatrices::QuantizedOnly):
  // forward dequantizes the looked-up rows only (ops::dequantized_embedding), frozen; weight.value is
  // then left empty. Null: the f32 table.
  std::shared_ptr<const quant::QuantizedMatrix> quantized;
};

// Mixed precision: the dtype of an activation computed from x for the bf16 GEMMs (and only those) that
// multiply it by `reader_weights`. bf16 when `bf16_output` is set, x is f32 on the CPU (the mixed-dtype
// kernels are CPU-only so far) and no reader's weight is sharded (dist::sharded_linear's backward
// multiplies its saved input in f32); else x's dtype. The producing op rounds once, as the GEMM would
// have: the same values, one conversion pass fewer, and the saved activation is the bf16 one.
DType mixed_output_dtype(bool bf16_output, const Tensor& x, std::initializer_list<const Parameter*> reader_weights);

// weight (gain): [C], initialised to 1.
class RMSNorm : public Module {
 public:
  RMSNorm(const std::string& name, int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const;  // x: [..., C]
  Parameter& weight;
  float eps;
  // Mixed precision: an f32 x gives a bf16 y, for the bf16 GEMMs (and only those) that read it.
  bool bf16_output = false;
  // The dtype y gets for x (ops::rms_norm's y_dtype), given the layer that reads y (mixed_output_dtype).
  DType output_dtype(const Tensor& x, const Linear& reader) const {
    return mixed_output_dtype(bf16_output, x, {&reader.weight});
  }
  Tensor forward(const Tensor& x, const Linear& reader) const;  // forward, y's dtype as output_dtype's
  // The same for y read by several layers' GEMMs, given their weights.
  Tensor forward(const Tensor& x, std::initializer_list<const Parameter*> reader_weights) const;
};

// weight: [C] (ones), bias: [C] (zeros). PyTorch's LayerNorm: biased variance, eps inside the sqrt.
class LayerNorm : public Module {
 public:
  LayerNorm(const std::string& name, int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const;  // x: [..., C]
  Parameter& weight;
  Parameter& bias;
  float eps;
  // Mixed precision, as RMSNorm's: an f32 x gives a bf16 y for the bf16 GEMMs that read it.
  bool bf16_output = false;
  // forward, y's dtype as mixed_output_dtype's for the GEMMs multiplying y by `reader_weights`.
  Tensor forward(const Tensor& x, std::initializer_list<const Parameter*> reader_weights) const;
};

// w2(silu(w1 x) * w3 x). w1, w3: [F, C]; w2: [C, F].
class SwiGLU : public Module {
 public:
  SwiGLU(const std::string& name, int64_t d_model, int64_t d_ff, RngKey key);
  // Every weight drawn from `init` (DeepSeek-V3: normal 0.02) instead of Linear's default.
  SwiGLU(const std::string& name, int64_t d_model, int64_t d_ff, RngKey key, const Init& init);
  Tensor forward(const Tensor& x) const;  // x: [..., C]
  Linear w1, w2, w3;
  // Mixed precision: the gate's output silu(w1 x) * w3 x is written in bf16 for w2's bf16 GEMM
  // (mixed_output_dtype, reader w2) instead of being converted by it.
  bool bf16_output = false;
};

// RoPE with cos/sin tables cached up to max_seq_len (positions beyond it are an error).
class RotaryPositionalEmbedding {
 public:
  RotaryPositionalEmbedding(float theta, int64_t head_dim, int64_t max_seq_len,
                            ops::RopeStyle style = ops::RopeStyle::Interleaved);
  Tensor forward(const Tensor& x, const Tensor& positions) const;  // x: [..., T, D]
  float theta;
  int64_t head_dim, max_seq_len;
  ops::RopeStyle style;
  ops::RopeCache cache;  // cos, sin: [max_seq_len, D/2] = cos/sin(p * theta^(-2i/D))
};

// What varies between the families' attention layers.
struct AttentionOptions {
  // Grouped-query attention: k_proj/v_proj produce num_kv_heads heads, each shared by
  // num_heads / num_kv_heads query heads; 0 means num_heads.
  int64_t num_kv_heads = 0;
  std::optional<RotaryPositionalEmbedding> rope;  // on q and k (Llama), or none (GPT-2)
  bool qkv_bias = false, output_bias = false;
  std::optional<Init> init, output_init;  // default: Linear's
};

// Dropout on the attention probabilities during training: p, and the key of this layer's masks
// (ops::causal_self_attention draws the masks).
using ops::AttentionDropout;

// Causal multi-head self-attention with optional RoPE on q and k.
// q_proj, output_proj: [C, C]; k_proj, v_proj: [Hkv*D, C].
class MultiHeadSelfAttention : public Module {
 public:
  MultiHeadSelfAttention(const std::string& name, int64_t d_model, int64_t num_heads, RngKey key,
                         std::optional<RotaryPositionalEmbedding> rope = std::nullopt, int64_t num_kv_heads = 0);
  MultiHeadSelfAttention(const std::string& name, int64_t d_model, int64_t num_heads, RngKey key,
                         AttentionOptions options);
  // x: [B, T, C]; positions: i32 [T] or [B, T] (only used with RoPE). Returns [B, T, C].
  // key_begin: document masking of packed rows (ops::causal_self_attention), or undefined.
  Tensor forward(const Tensor& x, const Tensor& positions, const AttentionDropout& dropout = {},
                 const Tensor& key_begin = Tensor()) const;
  // Incremental decoding (no autodiff): x: [B, t, C] are the next t tokens at `positions` [t]; their
  // rotated keys and values are appended to `cache` layer `layer`, and they attend causally to
  // everything cached before them. Returns [B, t, C].
  Tensor forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache, int64_t layer) const;
  int64_t d_model, num_heads, num_kv_heads;
  Linear q_proj, k_proj, v_proj, output_proj;
  std::optional<RotaryPositionalEmbedding> rope;
};

// Pre-norm block: h = x + attn(ln1(x)); y = h + ffn(ln2(h)).
class TransformerBlock : public Module {
 public:
  TransformerBlock(const std::string& name, int64_t d_model, int64_t num_heads, int64_t d_ff,
                   int64_t max_seq_len, float rope_theta, float norm_eps, RngKey key, int64_t num_kv_heads = 0);
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& key_begin = Tensor()) const;  // x: [B, T, C]
  Tensor forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache, int64_t layer) const;
  MultiHeadSelfAttention attn;
  RMSNorm ln1, ln2;
  SwiGLU ffn;
};

}  // namespace loom::nn
