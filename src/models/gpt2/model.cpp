#include "models/gpt2/model.h"

#include <cmath>

#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/loss.h"

namespace loom::gpt2 {

namespace {

constexpr float kInitStd = 0.02f;

const Config& validated(const Config& c) {
  c.validate();
  return c;
}

// The residual output projections' std: 0.02 / sqrt(2 * layers) (GPT-2 paper, section 2.3).
nn::Init residual_init(const Config& c) {
  return nn::Init::normal(kInitStd / std::sqrt(2.0f * static_cast<float>(c.num_layers)));
}

nn::AttentionOptions attention_options(const Config& c) {
  nn::AttentionOptions o;
  o.qkv_bias = c.qkv_bias;
  o.output_bias = c.output_proj_bias;
  o.init = nn::Init::normal(kInitStd);
  o.output_init = residual_init(c);
  return o;
}

Tensor dropout_at(const Tensor& x, float p, const models::ForwardContext& ctx, RngKey site) {
  if (!ctx.training || p == 0) return x;
  return ops::dropout(x, p, site, /*training=*/true);
}

}  // namespace

Mlp::Mlp(const std::string& name, const Config& c, RngKey key)
    : fc(nn::join(name, "fc"), c.d_model, c.ffn_dim(), key, nn::Init::normal(kInitStd), /*bias=*/true),
      proj(nn::join(name, "proj"), c.ffn_dim(), c.d_model, key, residual_init(c), /*bias=*/true) {
  proj.weight.group = nn::ParamGroup::DenseOut;
  add_child(&fc);
  add_child(&proj);
}

Tensor Mlp::forward(const Tensor& x) const {
  Tensor h = fc.forward(x);
  return proj.forward(ops::gelu(h, ops::GeluApproximation::Tanh, nn::mixed_output_dtype(bf16_output, h, {&proj.weight})));
}

Block::Block(const std::string& name, const Config& c, RngKey key)
    : ln1(nn::join(name, "ln1"), c.d_model, c.norm_eps),
      attn(nn::join(name, "attn"), c.d_model, c.num_heads, key, attention_options(c)),
      ln2(nn::join(name, "ln2"), c.d_model, c.norm_eps),
      mlp(nn::join(name, "mlp"), c, key) {
  add_child(&ln1);
  add_child(&attn);
  add_child(&ln2);
  add_child(&mlp);
}

Tensor Block::forward(const Tensor& x, const models::ForwardContext& ctx, int64_t layer, float p) const {
  const RngKey key = ctx.dropout_key.fold_in(static_cast<uint64_t>(layer));
  nn::AttentionDropout attn_dropout;
  if (ctx.training) attn_dropout = {p, key.fold_in("attn_probs")};
  Tensor h = ops::add(x, dropout_at(attn.forward(ln1_forward(x), Tensor(), attn_dropout, ctx.key_begin), p, ctx,
                                    key.fold_in("attn_out")));
  return ops::add(h, dropout_at(mlp.forward(ln2_forward(h)), p, ctx, key.fold_in("mlp_out")));
}

Tensor Block::forward_cached(const Tensor& x, const Tensor& positions, nn::KVCache& cache, int64_t layer) const {
  Tensor h = ops::add(x, attn.forward_cached(ln1_forward(x), positions, cache, layer));
  return ops::add(h, mlp.forward(ln2_forward(h)));
}

// The norms feed only GEMMs (q, k, v; fc): under bf16 they round their output themselves.
Tensor Block::ln1_forward(const Tensor& x) const {
  return ln1.forward(x, {&attn.q_proj.weight, &attn.k_proj.weight, &attn.v_proj.weight});
}

Tensor Block::ln2_forward(const Tensor& h) const { return ln2.forward(h, {&mlp.fc.weight}); }

GPT2::GPT2(const Config& config, uint64_t seed)
    : models::LanguageModel(models::ModelConfig::from_json(validated(config).to_json())),
      config_(config),
      token_embeddings("token_embeddings", config.vocab_size, config.d_model, RngKey::from_seed(seed),
                       nn::Init::normal(kInitStd), nn::ParamGroup::Embedding),
      position_embeddings("position_embeddings", config.context_length, config.d_model, RngKey::from_seed(seed),
                          nn::Init::normal(kInitStd), nn::ParamGroup::Position),
      ln_final("ln_final", config.d_model, config.norm_eps) {
  const RngKey key = RngKey::from_seed(seed);
  add_child(&token_embeddings);
  add_child(&position_embeddings);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers.push_back(std::make_unique<Block>("layers." + std::to_string(i), config, key));
    add_child(layers.back().get());
  }
  add_child(&ln_final);
  if (!config.tie_embeddings) {
    lm_head = std::make_unique<nn::Linear>("lm_head", config.d_model, config.vocab_size, key,
                                           nn::Init::normal(kInitStd), /*bias=*/false);
    lm_head->weight.group = nn::ParamGroup::LmHead;
    add_child(lm_head.get());
  }
}

Tensor GPT2::head_weight() const { return nn::compute_value(head_parameter()); }

nn::Parameter& GPT2::head_parameter() const { return lm_head ? lm_head->weight : token_embeddings.weight; }

Tensor GPT2::embed(const Tensor& ids, int64_t start, const models::ForwardContext& ctx) const {
  check_dtype(ids, DType::I32, "GPT2", "ids");
  check_ndim(ids, 2, "GPT2", "ids");
  const int64_t B = ids.size(0), t = ids.size(1);
  LOOM_CHECK(t >= 1 && start + t <= config_.context_length, "GPT2: positions ", start, "..", start + t - 1,
             " pass the context_length ", config_.context_length, " (GPT-2's positions are learned up to it)");
  // Position ids [B, t]: one lookup gives [B, t, C], so the sum needs no broadcast and the backward of
  // the position table sums over the batch in the embedding's fixed order.
  Tensor positions = Tensor::empty({B, t}, DType::I32);
  int32_t* p = positions.data<int32_t>();
  if (ctx.positions.defined()) {  // packed rows: positions restarting per document
    LOOM_CHECK(start == 0 && ctx.positions.shape() == ids.shape() && ctx.positions.dtype() == DType::I32,
               "GPT2: packed positions ", ctx.positions.describe(), " do not match ids ", ids.describe());
    const int32_t* src = ctx.positions.data<int32_t>();
    for (int64_t i = 0; i < B * t; ++i) {
      LOOM_CHECK(src[i] >= 0 && src[i] < config_.context_length, "GPT2: position ", src[i],
                 " is outside the learned positions 0..", config_.context_length - 1);
      p[i] = src[i];
    }
  } else {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < t; ++i) p[b * t + i] = static_cast<int32_t>(start + i);
    }
  }
  // The position ids go where the ids are (a no-op on the CPU), so the lookup runs on the model's device.
  Tensor x = ops::add(token_embeddings.forward(ids), position_embeddings.forward(positions.to(ids.device())));
  return dropout_at(x, config_.dropout, ctx, ctx.dropout_key.fold_in("embeddings"));
}

Tensor GPT2::hidden(const Tensor& ids, const models::ForwardContext& ctx) const {
  Tensor x = embed(ids, 0, ctx);
  for (size_t i = 0; i < layers.size(); ++i) {
    const Block* block = layers[i].get();
    const float p = config_.dropout;
    x = models::recompute_block(ctx, x, [block, ctx, i, p](const Tensor& in) {
      return block->forward(in, ctx, static_cast<int64_t>(i), p);
    });
  }
  return ln_final.forward(x, {&head_parameter()});
}

Tensor GPT2::logits(const Tensor& ids, const models::ForwardContext& ctx) const {
  return ops::linear(hidden(ids, ctx), head_weight(), Tensor(), ops::WeightLayout::OutIn, head_precision);
}

Tensor GPT2::loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx) const {
  LOOM_CHECK(targets.defined() && targets.shape() == ids.shape(), "GPT2::loss: targets ", targets.describe(),
             " do not match ids ", ids.describe());
  // The head and the loss fused over row chunks: the [B*T, V] logits and their gradient never exist. A
  // tied head's gradient adds to the embedding's through the shared leaf. Mixed precision: the head
  // weight's bf16 copy, which the optimizer keeps current (nn::bf16_weight_of).
  nn::Parameter& head = head_parameter();
  const bool bf16_copy = head_precision == ops::MatmulPrecision::BF16 && !head.dist;
  return ops::linear_cross_entropy(hidden(ids, ctx), head_weight(), targets, -100, head_precision, 512,
                                   bf16_copy ? nn::bf16_weight_of(head) : Tensor());
}

Tensor GPT2::stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids, const Tensor& targets,
                           const models::ForwardContext& ctx, Tensor*) const {
  // hidden() and loss() cut at the block boundaries: the same calls on the same values.
  LOOM_CHECK(0 <= first && first < last && last <= config_.num_layers, "GPT2::stage_forward: layers [", first, ", ",
             last, ") outside [0, ", config_.num_layers, ")");
  Tensor h = first == 0 ? embed(ids, 0, ctx) : x;  // [B, T, C]
  for (int64_t i = first; i < last; ++i) {
    const Block* block = layers[static_cast<size_t>(i)].get();
    const float p = config_.dropout;
    h = models::recompute_block(ctx, h, [block, ctx, i, p](const Tensor& in) { return block->forward(in, ctx, i, p); });
  }
  if (last < config_.num_layers) return h;
  nn::Parameter& head = head_parameter();
  const bool bf16_copy = head_precision == ops::MatmulPrecision::BF16 && !head.dist;
  return ops::linear_cross_entropy(ln_final.forward(h, {&head_parameter()}), head_weight(), targets, -100,
                                   head_precision, 512, bf16_copy ? nn::bf16_weight_of(head) : Tensor());
}

int GPT2::pipeline_ends(const nn::Parameter& p) const {
  if (&p == &token_embeddings.weight) return lm_head ? 1 : 3;
  return models::LanguageModel::pipeline_ends(p);
}

std::unique_ptr<nn::DecodeCache> GPT2::make_decode_cache(int64_t batch) const {
  return std::make_unique<nn::KVCache>(config_.num_layers, batch, config_.num_heads, config_.context_length,
                                             config_.head_dim());
}

Tensor GPT2::decode(const Tensor& ids, nn::DecodeCache& cache_base) const {
  auto* cache = dynamic_cast<nn::KVCache*>(&cache_base);
  LOOM_CHECK(cache != nullptr, "GPT2::decode: the cache was not made by this model's make_decode_cache");
  autograd::NoGradGuard no_grad;
  const int64_t start = cache->length();
  Tensor x = embed(ids, start, {});
  const int64_t t = ids.size(1);
  Tensor positions = Tensor::empty({t}, DType::I32);  // unused without RoPE, passed for the interface
  for (int64_t i = 0; i < t; ++i) positions.data<int32_t>()[i] = static_cast<int32_t>(start + i);
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, positions, *cache, static_cast<int64_t>(i));
  cache->advance(t);
  return ops::linear(ln_final.forward(x, {&head_parameter()}), head_weight(), Tensor(), ops::WeightLayout::OutIn,
                     head_precision);
}

std::optional<nn::DecoderWeights> GPT2::decoder_weights() const {
  nn::DecoderWeights w;
  w.num_heads = w.num_kv_heads = config_.num_heads;
  w.context_length = config_.context_length;
  w.norm = nn::DecoderNorm::Layer;
  // Any part that cannot be described leaves the model to the per-sequence path.
  auto ok = [](const std::string& why) { return why.empty(); };
  if (!ok(nn::describe_plain(token_embeddings.weight, w.token_embeddings)) ||
      !ok(nn::describe_plain(position_embeddings.weight, w.position_embeddings)) ||
      !ok(nn::describe_plain(ln_final.weight, w.final_norm)) || !ok(nn::describe_plain(ln_final.bias, w.final_norm_bias))) {
    return std::nullopt;
  }
  w.final_norm_eps = ln_final.eps;
  if (lm_head) {
    if (!ok(nn::describe_linear(*lm_head, w.head))) return std::nullopt;
  } else {
    w.head.f32 = w.token_embeddings;  // tied
  }
  for (const auto& layer : layers) {
    const Block& b = *layer;
    nn::DecoderLayerWeights l;
    l.ffn = nn::DecoderFfn::GeluTanh;
    const std::pair<const nn::Linear*, nn::DecoderMatrix*> linears[] = {
        {&b.attn.q_proj, &l.q_proj}, {&b.attn.k_proj, &l.k_proj}, {&b.attn.v_proj, &l.v_proj},
        {&b.attn.output_proj, &l.output_proj}, {&b.mlp.fc, &l.w1}, {&b.mlp.proj, &l.w2}};
    for (const auto& [linear, out] : linears) {
      if (!ok(nn::describe_linear(*linear, *out))) return std::nullopt;
    }
    if (b.attn.rope) return std::nullopt;  // GPT-2's attention has none; the description would drop it
    if (!ok(nn::describe_plain(b.ln1.weight, l.attn_norm)) || !ok(nn::describe_plain(b.ln1.bias, l.attn_norm_bias)) ||
        !ok(nn::describe_plain(b.ln2.weight, l.ffn_norm)) || !ok(nn::describe_plain(b.ln2.bias, l.ffn_norm_bias))) {
      return std::nullopt;
    }
    l.attn_norm_eps = b.ln1.eps;
    l.ffn_norm_eps = b.ln2.eps;
    w.layers.push_back(std::move(l));
  }
  w.check();
  return w;
}

void GPT2::set_matmul_precision(ops::MatmulPrecision precision) {
  for (auto& layer : layers) {
    for (nn::Linear* l : {&layer->attn.q_proj, &layer->attn.k_proj, &layer->attn.v_proj, &layer->attn.output_proj,
                          &layer->mlp.fc, &layer->mlp.proj}) {
      l->precision = precision;
    }
  }
  if (lm_head) lm_head->precision = precision;
  head_precision = precision;
  // The norms and GELU feed only those GEMMs: under bf16 they write their outputs in bf16 themselves.
  const bool bf16 = precision == ops::MatmulPrecision::BF16;
  for (auto& layer : layers) layer->ln1.bf16_output = layer->ln2.bf16_output = layer->mlp.bf16_output = bf16;
  ln_final.bf16_output = bf16;
}

}  // namespace loom::gpt2
