#include "nn/layers.h"

#include <cmath>

#include "nn/sharded.h"

#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/shape.h"
#include "quant/linear.h"

namespace loom::nn {

Linear::Linear(const std::string& name, int64_t in_features, int64_t out_features, RngKey key)
    : Linear(name, in_features, out_features, key, default_init(in_features, out_features), false) {}

Init Linear::default_init(int64_t in_features, int64_t out_features) {
  return Init::truncated_normal(std::sqrt(2.0f / static_cast<float>(in_features + out_features)));
}

Linear::Linear(const std::string& name, int64_t in_features, int64_t out_features, RngKey key, const Init& init,
               bool with_bias)
    : weight(add_parameter(make_parameter(join(name, "weight"), {out_features, in_features}, init, key))) {
  if (with_bias) {
    bias = &add_parameter(make_parameter(join(name, "bias"), {out_features}, Init::zeros(), key, ParamGroup::Bias));
  }
}

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = base_forward(x);
  return lora ? ops::add(y, lora->delta(x, precision)) : y;
}

Tensor Linear::base_forward(const Tensor& x) const {
  if (weight.dist) {
    LOOM_CHECK(!lora, weight.name, ": LoRA on a layer sharded over a mesh is not supported");
    return dist::sharded_linear(x, weight, bias, precision);
  }
  if (quantized) {
    LOOM_CHECK(!(autograd::grad_enabled() && weight.value.requires_grad()), weight.name, " is held quantized (",
               quant::quant_type_name(quantized->type()), ") for inference only; there is no backward pass "
               "through it. Load the weights as f32 to train, or run under no-grad");
    // Recording a backward pass through it (a LoRA on a quantized base), or asked to: the dequantized
    // weights by tiles, exact and differentiable in x; else the integer kernels.
    if (dequantized_matmul || (autograd::grad_enabled() && x.requires_grad())) {
      return ops::dequantized_linear(x, quantized, bias ? bias->value : Tensor(), weight.name);
    }
    // A norm rounding its output for bf16 GEMMs (mixed precision) may hand a bf16 x: the integer kernels take f32.
    const Tensor xf = x.dtype() == DType::BF16 && !x.requires_grad() ? x.to(DType::F32) : x;
    return quant::quantized_linear(xf, *quantized, bias ? bias->value : Tensor(), weight.name);
  }
  // Mixed precision: the weight's bf16 copy, which the optimizer keeps current (nn::bf16_weight_of).
  const bool bf16_copy = precision == ops::MatmulPrecision::BF16 && weight.value.dtype() == DType::F32;
  return ops::linear(x, weight.value, bias ? bias->value : Tensor(), ops::WeightLayout::OutIn, precision,
                     bf16_copy ? bf16_weight_of(weight) : Tensor());
}

std::string Linear::name() const {
  const std::string& w = weight.name;
  return w.ends_with(".weight") ? w.substr(0, w.size() - 7) : w;
}

LoRA& Linear::attach_lora(const LoraOptions& options, RngKey key) {
  LOOM_CHECK(!lora, name(), " already has a LoRA adapter");
  LOOM_CHECK(!weight.dist, name(), ": LoRA on a layer sharded over a mesh is not supported");
  const int64_t in = quantized ? quantized->cols() : weight.value.size(1);
  const int64_t out = quantized ? quantized->rows() : weight.value.size(0);
  lora = std::make_unique<LoRA>(name(), in, out, options, key);
  add_child(lora.get());
  layers_changed();
  return *lora;
}

std::unique_ptr<LoRA> Linear::detach_lora() {
  std::unique_ptr<LoRA> out = std::move(lora);
  if (out) {
    remove_child(out.get());
    layers_changed();
  }
  return out;
}

void Linear::set_quantized(std::shared_ptr<const quant::QuantizedMatrix> q) {
  if (q) {
    LOOM_CHECK(q->rows() == weight.value.size(0) && q->cols() == weight.value.size(1), weight.name,
               ": quantized weight is [", q->rows(), ", ", q->cols(), "] but the layer's weight is ",
               weight.value.shape());
    LOOM_CHECK(quant::has_matmul_kernels(q->type()), weight.name, ": ", quant::quant_type_name(q->type()),
               " weights cannot be multiplied quantized (Q8_0, Q4_0, Q4_1, Q4_K and Q6_K can); dequantize them");
  }
  quantized = std::move(q);
  layers_changed();
}

Embedding::Embedding(const std::string& name, int64_t num_embeddings, int64_t dim, RngKey key)
    : weight(add_parameter(
          make_parameter(join(name, "weight"), {num_embeddings, dim}, Init::truncated_normal(1.0f), key,
                         ParamGroup::Embedding))) {}

Embedding::Embedding(const std::string& name, int64_t num_embeddings, int64_t dim, RngKey key, const Init& init,
                     ParamGroup group)
    : weight(add_parameter(make_parameter(join(name, "weight"), {num_embeddings, dim}, init, key, group))) {}

Tensor Embedding::forward(const Tensor& ids) const {
  if (quantized) return ops::dequantized_embedding(ids, *quantized);
  return ops::embedding(ids, compute_value(weight));
}

LayerNorm::LayerNorm(const std::string& name, int64_t dim, float eps_)
    : weight(add_parameter(make_parameter(join(name, "weight"), {dim}, Init::ones(), RngKey{}, ParamGroup::Norm))),
      bias(add_parameter(make_parameter(join(name, "bias"), {dim}, Init::zeros(), RngKey{}, ParamGroup::Norm))),
      eps(eps_) {}

Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight.value, bias.value, eps); }

Tensor LayerNorm::forward(const Tensor& x, std::initializer_list<const Parameter*> reader_weights) const {
  return ops::layer_norm(x, weight.value, bias.value, eps, mixed_output_dtype(bf16_output, x, reader_weights));
}

DType mixed_output_dtype(bool bf16_output, const Tensor& x, std::initializer_list<const Parameter*> reader_weights) {
  if (!bf16_output || x.dtype() != DType::F32 || !x.device().is_cpu()) return x.dtype();
  for (const Parameter* w : reader_weights) {
    if (w->dist) return x.dtype();
  }
  return DType::BF16;
}

RMSNorm::RMSNorm(const std::string& name, int64_t dim, float eps_)
    : weight(add_parameter(make_parameter(join(name, "weight"), {dim}, Init::ones(), RngKey{}, ParamGroup::Norm))),
      eps(eps_) {}

Tensor RMSNorm::forward(const Tensor& x) const { return ops::rms_norm(x, weight.value, eps); }

Tensor RMSNorm::forward(const Tensor& x, const Linear& reader) const {
  return ops::rms_norm(x, weight.value, eps, output_dtype(x, reader));
}

Tensor RMSNorm::forward(const Tensor& x, std::initializer_list<const Parameter*> reader_weights) const {
  return ops::rms_norm(x, weight.value, eps, mixed_output_dtype(bf16_output, x, reader_weights));
}

SwiGLU::SwiGLU(const std::string& name, int64_t d_model, int64_t d_ff, RngKey key)
    : w1(join(name, "w1"), d_model, d_ff, key),
      w2(join(name, "w2"), d_ff, d_model, key),
      w3(join(name, "w3"), d_model, d_ff, key) {
  add_child(&w1);
  add_child(&w2);
  add_child(&w3);
}

SwiGLU::SwiGLU(const std::string& name, int64_t d_model, int64_t d_ff, RngKey key, const Init& init)
    : w1(join(name, "w1"), d_model, d_ff, key, init, /*bias=*/false),
      w2(join(name, "w2"), d_ff, d_model, key, init, /*bias=*/false),
      w3(join(name, "w3"), d_model, d_ff, key, init, /*bias=*/false) {
  add_child(&w1);
  add_child(&w2);
  add_child(&w3);
}

Tensor SwiGLU::forward(const Tensor& x) const {
  Tensor gate = w1.forward(x), up = w3.forward(x);
  Tensor h = ops::swiglu(gate, up, mixed_output_dtype(bf16_output, gate, {&w2.weight}));
  if (w2.lora && w2.quantized && autograd::grad_enabled()) {
    // A quantized w2 keeps nothing of h for its backward (frozen: dx = dy W only), so the adapter's would be
    // h's only copy, [..., d_ff] per layer held from the forward to the backward: the adapter rebuilds it
    // from gate and up, which swiglu's backward keeps anyway (Linear::forward's sum, the same bits).
    return ops::add(w2.base_forward(h), w2.lora->delta(h, w2.precision, [gate, up] { return ops::swiglu(gate, up); }));
  }
  return w2.forward(h);
}

RotaryPositionalEmbedding::RotaryPositionalEmbedding(float theta_, int64_t head_dim_, int64_t max_seq_len_,
                                                     ops::RopeStyle style_)
    : theta(theta_), head_dim(head_dim_), max_seq_len(max_seq_len_), style(style_) {
  LOOM_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head dimension, got ", head_dim);
  LOOM_CHECK(max_seq_len > 0, "RoPE max_seq_len must be positive, got ", max_seq_len);
  LOOM_CHECK(theta > 0, "RoPE theta must be positive, got ", theta);
  cache = ops::make_rope_cache(max_seq_len, head_dim, theta);
}

Tensor RotaryPositionalEmbedding::forward(const Tensor& x, const Tensor& positions) const {
  return ops::rope(x, positions, cache, style);
}

namespace {
int64_t checked_head_dim(const std::string& name, int64_t d_model, int64_t num_heads) {
  LOOM_CHECK(num_heads > 0 && d_model % num_heads == 0, name, ": d_model=", d_model,
             " is not divisible by num_heads=", num_heads);
  return d_model / num_heads;
}
int64_t checked_kv_heads(const std::string& name, int64_t num_heads, int64_t num_kv_heads) {
  if (num_kv_heads == 0) return num_heads;
  LOOM_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, name, ": num_kv_heads=", num_kv_heads,
             " does not divide num_heads=", num_heads);
  return num_kv_heads;
}
}  // namespace

namespace {
// Linear's default init (CS336's truncated normal) unless the family gives one.
Init linear_init(const std::optional<Init>& init, int64_t in, int64_t out) {
  return init ? *init : Linear::default_init(in, out);
}
}  // namespace

MultiHeadSelfAttention::MultiHeadSelfAttention(const std::string& name, int64_t d_model_, int64_t num_heads_,
                                               RngKey key, std::optional<RotaryPositionalEmbedding> rope_,
                                               int64_t num_kv_heads_)
    : MultiHeadSelfAttention(name, d_model_, num_heads_, key,
                             [&] {
                               AttentionOptions o;
                               o.num_kv_heads = num_kv_heads_;
                               o.rope = std::move(rope_);
                               return o;
                             }()) {}

MultiHeadSelfAttention::MultiHeadSelfAttention(const std::string& name, int64_t d_model_, int64_t num_heads_,
                                               RngKey key, AttentionOptions o)
    : d_model(d_model_),
      num_heads(num_heads_),
      num_kv_heads(checked_kv_heads(name, num_heads_, o.num_kv_heads)),
      q_proj(join(name, "q_proj"), d_model_, d_model_, key, linear_init(o.init, d_model_, d_model_), o.qkv_bias),
      k_proj(join(name, "k_proj"), d_model_, num_kv_heads * checked_head_dim(name, d_model_, num_heads_), key,
             linear_init(o.init, d_model_, num_kv_heads * (d_model_ / num_heads_)), o.qkv_bias),
      v_proj(join(name, "v_proj"), d_model_, num_kv_heads * checked_head_dim(name, d_model_, num_heads_), key,
             linear_init(o.init, d_model_, num_kv_heads * (d_model_ / num_heads_)), o.qkv_bias),
      output_proj(join(name, "output_proj"), d_model_, d_model_, key,
                  linear_init(o.output_init ? o.output_init : o.init, d_model_, d_model_), o.output_bias),
      rope(std::move(o.rope)) {
  output_proj.weight.group = ParamGroup::DenseOut;
  add_child(&q_proj);
  add_child(&k_proj);
  add_child(&v_proj);
  add_child(&output_proj);
}

Tensor MultiHeadSelfAttention::forward(const Tensor& x, const Tensor& positions, const AttentionDropout& dropout,
                                       const Tensor& key_begin) const {
  check_ndim(x, 3, "MultiHeadSelfAttention", "x");
  LOOM_CHECK(x.size(2) == d_model, "MultiHeadSelfAttention: x has C=", x.size(2), " but d_model=", d_model);
  Tensor q = q_proj.forward(x);  // [B, T, C]
  Tensor k = k_proj.forward(x);
  Tensor v = v_proj.forward(x);
  std::optional<ops::RopeOptions> rope_options;
  if (rope) rope_options = ops::RopeOptions{positions, rope->theta, rope->style, rope->cache};
  // Under tensor parallelism q, k and v hold this rank's whole heads only (dist::sharded_linear).
  const int64_t D = d_model / num_heads;
  // Mixed precision reaches the attention products too (as SDPA under autocast): q_proj's precision.
  Tensor y = ops::causal_self_attention(q, k, v, static_cast<int>(q.size(2) / D), rope_options,
                                        static_cast<int>(k.size(2) / D), dropout, q_proj.precision, key_begin);
  return output_proj.forward(y);
}

Tensor MultiHeadSelfAttention::forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache,
                                              int64_t layer) const {
  check_ndim(x, 3, "MultiHeadSelfAttention", "x");
  const int64_t B = x.size(0), t = x.size(1), D = d_model / num_heads;
  // [B, t, H*D] -> [B, H, t, D]; k and v have num_kv_heads heads (the cache holds only those).
  auto heads = [&](const Tensor& y, int64_t H) { return ops::transpose(y.view({B, t, H, D}), 1, 2); };
  Tensor q = heads(q_proj.forward(x), num_heads);
  Tensor k = heads(k_proj.forward(x), num_kv_heads);
  Tensor v = heads(v_proj.forward(x), num_kv_heads);
  if (rope) {
    q = rope->forward(q, positions);
    k = rope->forward(k, positions);
  }
  cache.write(layer, k, v);
  auto [keys, values] = cache.read(layer, t);  // [B, Hkv, length + t, D]
  // Query i (absolute position length + i) sees keys 0 .. length + i: the causal rule with offset.
  Tensor y = ops::scaled_dot_product_attention(q, keys, values, Tensor(), /*causal=*/true);
  y = ops::transpose(y, 1, 2).view({B, t, d_model});  // [B, t, C]
  return output_proj.forward(y);
}

TransformerBlock::TransformerBlock(const std::string& name, int64_t d_model, int64_t num_heads, int64_t d_ff,
                                   int64_t max_seq_len, float rope_theta, float norm_eps, RngKey key,
                                   int64_t num_kv_heads)
    : attn(join(name, "attn"), d_model, num_heads, key,
           RotaryPositionalEmbedding(rope_theta, checked_head_dim(name, d_model, num_heads), max_seq_len),
           num_kv_heads),
      ln1(join(name, "ln1"), d_model, norm_eps),
      ln2(join(name, "ln2"), d_model, norm_eps),
      ffn(join(name, "ffn"), d_model, d_ff, key) {
  add_child(&attn);
  add_child(&ln1);
  add_child(&ln2);
  add_child(&ffn);
}

Tensor TransformerBlock::forward(const Tensor& x, const Tensor& positions, const Tensor& key_begin) const {
  // h = x + attn(ln1(x)) and ln2(h) in one fused pass.
  // Under bf16 the norms round their outputs for the GEMMs that read them (q, k, v; w1, w3).
  ops::AddRmsNorm h = ops::add_rms_norm(attn.forward(ln1.forward(x, attn.q_proj), positions, {}, key_begin), x, ln2.weight.value,
                                        ln2.eps, ln2.output_dtype(x, ffn.w1));
  return ops::add(h.sum, ffn.forward(h.normed));
}

Tensor TransformerBlock::forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache,
                                        int64_t layer) const {
  Tensor h = ops::add(x, attn.forward_cached(ln1.forward(x, attn.q_proj), positions, cache, layer));
  return ops::add(h, ffn.forward(ln2.forward(h, ffn.w1)));
}

}  // namespace loom::nn
