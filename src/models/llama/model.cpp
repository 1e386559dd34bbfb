#include "models/llama/model.h"

#include <cstring>

#include "core/autograd.h"
#include "ops/decode_step.h"
#include "ops/loss.h"

namespace loom::llama {

namespace {
const Config& validated(const Config& c) {
  c.validate();
  return c;
}
}  // namespace

TransformerLM::TransformerLM(const Config& config, uint64_t seed)
    : models::LanguageModel(models::ModelConfig::from_json(validated(config).to_json())),
      config_(config),
      token_embeddings("token_embeddings", config.vocab_size, config.d_model, RngKey::from_seed(seed)),
      ln_final("ln_final", config.d_model, config.norm_eps),
      lm_head("lm_head", config.d_model, config.vocab_size, RngKey::from_seed(seed)) {
  RngKey key = RngKey::from_seed(seed);
  add_child(&token_embeddings);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers.push_back(std::make_unique<nn::TransformerBlock>("layers." + std::to_string(i), config.d_model,
                                                            config.num_heads, config.d_ff, config.context_length,
                                                            config.rope_theta, config.norm_eps, key,
                                                            config.kv_heads()));
    add_child(layers.back().get());
  }
  add_child(&ln_final);
  add_child(&lm_head);
  token_embeddings.weight.group = nn::ParamGroup::Embedding;
  lm_head.weight.group = nn::ParamGroup::LmHead;
  for (auto& layer : layers) {
    layer->attn.output_proj.weight.group = nn::ParamGroup::DenseOut;
    layer->ffn.w2.weight.group = nn::ParamGroup::DenseOut;
  }
  positions_cache_ = Tensor::empty({config.context_length}, DType::I32);
  for (int64_t t = 0; t < config.context_length; ++t) positions_cache_.data<int32_t>()[t] = static_cast<int32_t>(t);
  fused_ = plan_fused_decode(*this);  // f32 weights: unsupported until the Linear layers are quantized
}

void TransformerLM::on_layers_changed() { fused_ = plan_fused_decode(*this); }

std::optional<nn::DecoderWeights> TransformerLM::decoder_weights() const { return decoder_weights_of(*this); }

Tensor TransformerLM::fused_decode_step(int32_t token, nn::KVCache& cache) const {
  LOOM_CHECK(fused_.step != nullptr, "TransformerLM::fused_decode_step: the fused step cannot run this model: ",
             fused_.unsupported);
  std::vector<Tensor> k, v;  // per layer [1, Hkv, capacity, D]
  k.reserve(static_cast<size_t>(cache.num_layers()));
  v.reserve(static_cast<size_t>(cache.num_layers()));
  for (int64_t i = 0; i < cache.num_layers(); ++i) {
    k.push_back(cache.layer(i).k);
    v.push_back(cache.layer(i).v);
  }
  return ops::decode_step(*fused_.step, token, cache.length(), k, v);
}

Tensor TransformerLM::default_positions(int64_t T) const {
  return positions_cache_.slice(0, T);  // a view: no allocation per step
}

Tensor TransformerLM::hidden(const Tensor& ids, const Tensor& positions, const models::ForwardContext& ctx) const {
  check_dtype(ids, DType::I32, "TransformerLM", "ids");
  check_ndim(ids, 2, "TransformerLM", "ids");
  const int64_t T = ids.size(1);
  LOOM_CHECK(T >= 1 && T <= config_.context_length, "TransformerLM: sequence length ", T,
             " exceeds context_length ", config_.context_length);
  Tensor pos = positions.defined() ? positions : ctx.positions.defined() ? ctx.positions : default_positions(T);
  const Tensor key_begin = ctx.key_begin;  // packed rows: RoPE positions [B, T] restart per document
  Tensor x = token_embeddings.forward(ids);  // [B, T, C]
  for (const auto& layer : layers) {
    const nn::TransformerBlock* block = layer.get();
    x = models::recompute_block(ctx, x,
                                [block, pos, key_begin](const Tensor& in) { return block->forward(in, pos, key_begin); });
  }
  return ln_final.forward(x, lm_head);  // [B, T, C]
}

Tensor TransformerLM::forward(const Tensor& ids, const Tensor& positions) const {
  return lm_head.forward(hidden(ids, positions));  // [B, T, V]
}

Tensor TransformerLM::forward_cached(const Tensor& ids, nn::KVCache& cache, bool last_only) const {
  check_dtype(ids, DType::I32, "TransformerLM", "ids");
  check_ndim(ids, 2, "TransformerLM", "ids");
  const int64_t t = ids.size(1), start = cache.length();
  LOOM_CHECK(t >= 1 && start + t <= config_.context_length, "TransformerLM: ", start, " cached + ", t,
             " new tokens exceed context_length ", config_.context_length);
  autograd::NoGradGuard no_grad;
  if (t == 1 && ids.size(0) == 1 && fused_decode && fused_.step) {
    Tensor logits = fused_decode_step(ids.data<int32_t>()[0], cache);
    cache.advance(1);
    return logits;
  }
  Tensor pos = positions_cache_.slice(start, t);
  Tensor x = token_embeddings.forward(ids);
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, pos, cache, static_cast<int64_t>(i));
  cache.advance(t);
  if (last_only && t > 1) {  // x [B, t, C] -> [B, 1, C]: rows b*t + t-1
    const int64_t B = x.size(0), C = x.size(2);
    Tensor last = Tensor::empty({B, 1, C}, x.dtype());
    const size_t row = static_cast<size_t>(C) * dtype_size(x.dtype());
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(static_cast<char*>(last.raw_data()) + b * row,
                  static_cast<const char*>(x.raw_data()) + (b * t + t - 1) * row, row);
    }
    x = last;
  }
  return lm_head.forward(ln_final.forward(x, lm_head));
}

nn::KVCache TransformerLM::make_cache(int64_t batch) const {
  return nn::KVCache(config_.num_layers, batch, config_.kv_heads(), config_.context_length, config_.head_dim());
}

Tensor TransformerLM::logits(const Tensor& ids, const models::ForwardContext&) const { return forward(ids); }

std::unique_ptr<nn::DecodeCache> TransformerLM::make_decode_cache(int64_t batch) const {
  return std::make_unique<nn::KVCache>(make_cache(batch));
}

Tensor TransformerLM::decode(const Tensor& ids, nn::DecodeCache& cache) const {
  auto* kv = dynamic_cast<nn::KVCache*>(&cache);
  LOOM_CHECK(kv != nullptr, "TransformerLM::decode: the cache was not made by this model's make_decode_cache");
  return forward_cached(ids, *kv);
}

Tensor TransformerLM::decode_last(const Tensor& ids, nn::DecodeCache& cache) const {
  auto* kv = dynamic_cast<nn::KVCache*>(&cache);
  LOOM_CHECK(kv != nullptr, "TransformerLM::decode: the cache was not made by this model's make_decode_cache");
  return forward_cached(ids, *kv, /*last_only=*/true);
}

Tensor TransformerLM::loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx) const {
  LOOM_CHECK(targets.defined() && targets.shape() == ids.shape(), "TransformerLM::loss: targets ",
             targets.describe(), " do not match ids ", ids.describe());
  if (lm_head.quantized) {
    Tensor h = hidden(ids, Tensor(), ctx);
    // QLoRA (the head multiplied by its dequantized tiles, frozen): the tiles and the loss fused, so the
    // [B*T, V] logits and their gradient never exist (at SmolLM2's vocabulary of 49152 they would be
    // 190 KiB per position, twice). Inference's head goes through its integer kernels.
    if (!lm_head.lora && lm_head.bias == nullptr && (lm_head.dequantized_matmul || autograd::any_requires_grad({h}))) {
      return ops::dequantized_linear_cross_entropy(h, lm_head.quantized, targets, -100);
    }
    return ops::cross_entropy(lm_head.forward(h), targets, -100);
  }
  // The head and the loss fused over row chunks: the [B*T, V] logits and their gradient never exist.
  // Mixed precision: the head's bf16 weight copy, which the optimizer keeps current (nn::bf16_weight_of).
  const bool bf16_copy = lm_head.precision == ops::MatmulPrecision::BF16 && !lm_head.weight.dist;
  return ops::linear_cross_entropy(hidden(ids, Tensor(), ctx), nn::compute_value(lm_head.weight), targets, -100, lm_head.precision,
                                   512, bf16_copy ? nn::bf16_weight_of(lm_head.weight) : Tensor());
}

Tensor TransformerLM::stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids,
                                    const Tensor& targets, const models::ForwardContext& ctx, Tensor*) const {
  // hidden() and loss() cut at the block boundaries: the same calls on the same values.
  LOOM_CHECK(0 <= first && first < last && last <= config_.num_layers, "TransformerLM::stage_forward: layers [", first,
             ", ", last, ") outside [0, ", config_.num_layers, ")");
  Tensor pos = default_positions(ids.size(1));
  Tensor h = first == 0 ? token_embeddings.forward(ids) : x;  // [B, T, C]
  for (int64_t i = first; i < last; ++i) {
    const nn::TransformerBlock* block = layers[static_cast<size_t>(i)].get();
    h = models::recompute_block(ctx, h, [block, pos](const Tensor& in) { return block->forward(in, pos); });
  }
  if (last < config_.num_layers) return h;
  const bool bf16_copy = lm_head.precision == ops::MatmulPrecision::BF16 && !lm_head.weight.dist;
  return ops::linear_cross_entropy(ln_final.forward(h, lm_head), nn::compute_value(lm_head.weight), targets, -100,
                                   lm_head.precision, 512, bf16_copy ? nn::bf16_weight_of(lm_head.weight) : Tensor());
}

void TransformerLM::set_matmul_precision(ops::MatmulPrecision precision) {
  for (auto& layer : layers) {
    for (nn::Linear* l : {&layer->attn.q_proj, &layer->attn.k_proj, &layer->attn.v_proj, &layer->attn.output_proj,
                          &layer->ffn.w1, &layer->ffn.w2, &layer->ffn.w3}) {
      l->precision = precision;
    }
  }
  lm_head.precision = precision;
  // The norms feed only those GEMMs (q, k, v; w1, w3; the head): under bf16 they round their output
  // themselves, so the GEMMs convert nothing and the saved bf16 activation is shared by q, k and v.
  const bool bf16 = precision == ops::MatmulPrecision::BF16;
  // SwiGLU's gate likewise writes its output in bf16 for w2.
  for (auto& layer : layers) layer->ln1.bf16_output = layer->ln2.bf16_output = layer->ffn.bf16_output = bf16;
  ln_final.bf16_output = bf16;
}

}  // namespace loom::llama
