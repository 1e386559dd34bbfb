#include "models/deepseek_v3/model.h"

#include <algorithm>

#include "core/autograd.h"
#include "nn/expert_parallel.h"
#include "nn/sharded.h"
#include "io/json_checked.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/moe.h"
#include "ops/shape.h"

namespace loom::deepseek_v3 {

namespace {

const Config& validated(const Config& c) {
  c.validate();
  return c;
}

nn::Init init_of(const Config& c) { return nn::Init::normal(c.init_std); }

}  // namespace

MoE::MoE(const std::string& name, const Config& c, RngKey key)
    : top_k(c.top_k),
      route_scale(c.route_scale),
      alpha_seq(c.alpha_seq),
      router(nn::join(name, "router"), c.d_model, c.n_routed, key, init_of(c), false),
      w1(add_parameter(nn::make_parameter(nn::join(name, "experts.w1"), {c.n_routed, c.d_expert, c.d_model}, init_of(c),
                                          key, nn::ParamGroup::ExpertIn))),
      w3(add_parameter(nn::make_parameter(nn::join(name, "experts.w3"), {c.n_routed, c.d_expert, c.d_model}, init_of(c),
                                          key, nn::ParamGroup::ExpertIn))),
      w2(add_parameter(nn::make_parameter(nn::join(name, "experts.w2"), {c.n_routed, c.d_model, c.d_expert}, init_of(c),
                                          key, nn::ParamGroup::ExpertOut))),
      bias(Tensor::zeros({c.n_routed})),
      bias_name(nn::join(name, "bias")) {
  router.weight.group = nn::ParamGroup::DenseInWhole;  // every tensor rank routes every token
  add_child(&router);
  if (c.n_shared > 0) {
    shared = std::make_unique<nn::SwiGLU>(nn::join(name, "shared"), c.d_model, c.n_shared * c.d_expert, key, init_of(c));
    shared->w2.weight.group = nn::ParamGroup::DenseOut;
    add_child(shared.get());
  }
}

Tensor MoE::forward(const Tensor& x, RoutingRecord* record) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  Tensor xf = ops::reshape(x, {B * T, C});                       // [N, C]
  ops::MoeRouting r = ops::moe_route(router.forward(xf), bias, top_k, route_scale);
  Tensor y;  // [N, C]
  if (!w1.dist) {
    // With adapters, each stack is W + s B A (formed once per forward, differentiable in A and B).
    auto value = [this](const nn::Parameter& w) { return lora_of(w) ? lora_of(w)->adapted(w.value) : w.value; };
    y = ops::moe_experts(xf, r.expert_index, r.gates, value(w1), value(w3), value(w2), precision);
  } else if (lora_w1_ || lora_w3_ || lora_w2_) {
    LOOM_FAIL(w1.name, ": LoRA on experts sharded over a mesh is not supported");
  } else if (dist::is_split_over(w1, dist::MeshAxis::Expert)) {
    y = dist::expert_parallel_experts(xf, r.expert_index, r.gates, w1, w3, w2, precision);
  } else {
    // Sharded otherwise: FSDP gathers the data splits; under tensor parallelism each rank computes its
    // d_expert slice of every expert (f on the inputs, g on the partial output, as a row-parallel MLP).
    y = ops::moe_experts(dist::enter_tensor_split(xf, w1), r.expert_index, dist::enter_tensor_split(r.gates, w1),
                         dist::data_gathered_value(w1), dist::data_gathered_value(w3), dist::data_gathered_value(w2),
                         precision);
    y = dist::leave_tensor_split(y, w2);
  }
  if (shared) y = ops::add(y, shared->forward(xf));
  if (record != nullptr) {
    Tensor loss = ops::moe_sequence_balance_loss(r, B, T, alpha_seq);
    record->balance_loss = record->balance_loss.defined() ? ops::add(record->balance_loss, loss) : loss;
    record->expert_load.push_back(r.expert_load);
  }
  return ops::reshape(y, {B, T, C});
}

std::unique_ptr<nn::LoRA>& MoE::slot(const nn::Parameter& weight) {
  if (&weight == &w1) return lora_w1_;
  if (&weight == &w3) return lora_w3_;
  LOOM_CHECK(&weight == &w2, weight.name, " is not one of ", w1.name, ", ", w3.name, ", ", w2.name);
  return lora_w2_;
}

nn::LoRA& MoE::attach_expert_lora(const nn::Parameter& weight, const nn::LoraOptions& options, RngKey key) {
  std::unique_ptr<nn::LoRA>& s = slot(weight);
  LOOM_CHECK(!s, weight.name, " already has LoRA adapters");
  LOOM_CHECK(!weight.dist, weight.name, ": LoRA on experts sharded over a mesh is not supported");
  // [E, out, in]: w1 and w3 [E, F, C], w2 [E, C, F].
  const Shape& shape = weight.value.shape();
  s = std::make_unique<nn::LoRA>(weight.name, shape[2], shape[1], options, key, shape[0]);
  add_child(s.get());
  return *s;
}

std::unique_ptr<nn::LoRA> MoE::detach_expert_lora(const nn::Parameter& weight) {
  std::unique_ptr<nn::LoRA> out = std::move(slot(weight));
  if (out) remove_child(out.get());
  return out;
}

Block::Block(const std::string& name, const Config& c, RngKey key, bool is_moe)
    : attn_norm(nn::join(name, "attn_norm"), c.d_model, c.norm_eps),
      attn(nn::join(name, "attn"), c, key),
      ffn_norm(nn::join(name, "ffn_norm"), c.d_model, c.norm_eps) {
  add_child(&attn_norm);
  add_child(&attn);
  add_child(&ffn_norm);
  if (is_moe) {
    moe = std::make_unique<MoE>(nn::join(name, "moe"), c, key);
    add_child(moe.get());
  } else {
    mlp = std::make_unique<nn::SwiGLU>(nn::join(name, "mlp"), c.d_model, c.d_ff, key, init_of(c));
    mlp->w2.weight.group = nn::ParamGroup::DenseOut;
    add_child(mlp.get());
  }
}

Tensor Block::forward(const Tensor& x, const Tensor& positions, RoutingRecord* record, const Tensor& key_begin) const {
  // Under bf16 the norms round their outputs for the GEMMs that read them (nn::mixed_output_dtype): the
  // MLA down-projections, and a dense MLP's w1 and w3. A MoE layer's norm stays f32: its router
  // multiplies in f32.
  Tensor h = ops::add(x, attn.forward(attn_norm.forward(x, {&attn.wq_a.weight, &attn.wkv_a.weight}), positions,
                                      key_begin));
  Tensor n = moe ? ffn_norm.forward(h) : ffn_norm.forward(h, {&mlp->w1.weight, &mlp->w3.weight});
  return ops::add(h, moe ? moe->forward(n, record) : mlp->forward(n));
}

Tensor Block::forward_cached(const Tensor& x, const Tensor& positions, LatentCache& cache, int64_t layer) const {
  Tensor h = ops::add(x, attn.forward_cached(attn_norm.forward(x), positions, cache, layer));
  Tensor n = ffn_norm.forward(h);
  return ops::add(h, moe ? moe->forward(n, nullptr) : mlp->forward(n));
}

MtpModule::MtpModule(const std::string& name, const Config& c, RngKey key)
    : norm_h(nn::join(name, "norm_h"), c.d_model, c.norm_eps),
      norm_e(nn::join(name, "norm_e"), c.d_model, c.norm_eps),
      proj(nn::join(name, "proj"), 2 * c.d_model, c.d_model, key, init_of(c), false),
      block(nn::join(name, "block"), c, key, /*moe=*/false) {
  proj.weight.group = nn::ParamGroup::DenseInWhole;  // writes the residual stream whole
  add_child(&norm_h);
  add_child(&norm_e);
  add_child(&proj);
  add_child(&block);
}

DeepSeekV3::DeepSeekV3(const Config& config, uint64_t seed)
    : models::LanguageModel(models::ModelConfig::from_json(validated(config).to_json())),
      config_(config),
      token_embeddings("token_embeddings", config.vocab_size, config.d_model, RngKey::from_seed(seed), init_of(config),
                       nn::ParamGroup::Embedding),
      ln_final("ln_final", config.d_model, config.norm_eps),
      lm_head("lm_head", config.d_model, config.vocab_size, RngKey::from_seed(seed), init_of(config), false) {
  const RngKey key = RngKey::from_seed(seed);
  add_child(&token_embeddings);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers.push_back(std::make_unique<Block>("layers." + std::to_string(i), config, key, i >= config.n_dense));
    add_child(layers.back().get());
  }
  for (int64_t k = 0; k < config.n_mtp; ++k) {
    mtp.push_back(std::make_unique<MtpModule>("mtp." + std::to_string(k), config, key));
    add_child(mtp.back().get());
  }
  add_child(&ln_final);
  add_child(&lm_head);
  lm_head.weight.group = nn::ParamGroup::LmHead;
  positions_ = Tensor::empty({config.context_length}, DType::I32);
  for (int64_t t = 0; t < config.context_length; ++t) positions_.data<int32_t>()[t] = static_cast<int32_t>(t);
}

Tensor DeepSeekV3::positions(int64_t start, int64_t t) const { return positions_.slice(start, t); }

std::vector<MoE*> DeepSeekV3::moe_layers() const {
  std::vector<MoE*> out;
  for (const auto& l : layers) {
    if (l->moe) out.push_back(l->moe.get());
  }
  return out;
}

Tensor DeepSeekV3::trunk(const Tensor& ids, const Tensor& pos, RoutingRecord* record,
                         const models::ForwardContext& ctx) const {
  return blocks(token_embeddings.forward(ids), 0, config_.num_layers, pos, record, ctx);  // [B, T, C]
}

Tensor DeepSeekV3::blocks(Tensor x, int64_t first, int64_t last, const Tensor& pos, RoutingRecord* record,
                          const models::ForwardContext& ctx) const {
  for (int64_t i = first; i < last; ++i) {
    const auto& layer = layers[static_cast<size_t>(i)];
    const Tensor key_begin = ctx.key_begin;
    if (!ctx.training || ctx.recompute == models::Recompute::None) {
      x = layer->forward(x, pos, record, key_begin);
      continue;
    }
    // Recomputed: the block's balance loss leaves it as a second output (its graph is the second run's);
    // its expert loads are the first run's (the second run's routing is the same and is not counted).
    const Block* block = layer.get();
    const bool recorded = record != nullptr;
    auto loads = std::make_shared<std::vector<Tensor>>();
    auto first = std::make_shared<bool>(true);
    TensorList out = models::recompute_block(ctx, {x}, [block, pos, key_begin, recorded, loads, first](const TensorList& in) {
      RoutingRecord r;
      Tensor y = block->forward(in[0], pos, recorded ? &r : nullptr, key_begin);
      if (*first) *loads = r.expert_load;
      *first = false;
      return TensorList{y, r.balance_loss};
    });
    x = out[0];
    if (record != nullptr) {
      if (out[1].defined()) record->balance_loss = record->balance_loss.defined() ? ops::add(record->balance_loss, out[1]) : out[1];
      for (const Tensor& l : *loads) record->expert_load.push_back(l);
    }
  }
  return x;
}

namespace {
void check_ids(const Tensor& ids, int64_t context_length, const char* what) {
  check_dtype(ids, DType::I32, what, "ids");
  check_ndim(ids, 2, what, "ids");
  const int64_t T = ids.size(1);
  LOOM_CHECK(T >= 1 && T <= context_length, what, ": sequence length ", T, " is outside [1, context_length=",
             context_length, "]");
}
}  // namespace

Tensor DeepSeekV3::logits(const Tensor& ids, const models::ForwardContext&) const {
  check_ids(ids, config_.context_length, "DeepSeekV3::logits");
  Tensor x = trunk(ids, positions(0, ids.size(1)), nullptr);
  return lm_head.forward(ln_final.forward(x, lm_head));
}

DeepSeekV3::Losses DeepSeekV3::losses(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx) const {
  check_ids(ids, config_.context_length, "DeepSeekV3::losses");
  LOOM_CHECK(targets.defined() && targets.shape() == ids.shape(), "DeepSeekV3::losses: targets ", targets.describe(),
             " do not match ids ", ids.describe());
  const int64_t T = ids.size(1);
  LOOM_CHECK(T > config_.n_mtp, "DeepSeekV3::losses: sequence length ", T, " leaves no position for model.n_mtp=",
             config_.n_mtp, " prediction modules (needs T > n_mtp)");
  RoutingRecord record;
  Tensor h = trunk(ids, positions_of(ids, ctx), &record, ctx);  // [B, T, C]
  return head_losses(h, ids, targets, record, ctx.key_begin.defined() ? ctx.positions : Tensor(), ctx.key_begin);
}

Tensor DeepSeekV3::positions_of(const Tensor& ids, const models::ForwardContext& ctx) const {
  LOOM_CHECK(ctx.positions.defined() == ctx.key_begin.defined(),
             "DeepSeekV3: packed rows need both positions and key_begin (ForwardContext), got only one");
  if (!ctx.positions.defined()) return positions(0, ids.size(1));
  check_dtype(ctx.positions, DType::I32, "DeepSeekV3", "positions");
  LOOM_CHECK(ctx.positions.shape() == ids.shape(), "DeepSeekV3: packed positions ", ctx.positions.describe(),
             " do not match ids ", ids.describe());
  const int32_t* p = ctx.positions.data<int32_t>();
  for (int64_t i = 0; i < ctx.positions.numel(); ++i) {
    LOOM_CHECK(p[i] >= 0 && p[i] < config_.context_length, "DeepSeekV3: packed position ", p[i],
               " is outside [0, context_length=", config_.context_length, ")");
  }
  return ctx.positions;
}

namespace {
// Module k's targets narrow(targets, 1, k, n) in packed rows: position t keeps its target only when t + k
// is in t's document (key_begin equal), so no module predicts across a document's end.
Tensor targets_within_documents(const Tensor& targets_k, const Tensor& key_begin, int64_t k) {
  Tensor out = targets_k.clone();
  const int64_t B = out.size(0), n = out.size(1), T = key_begin.size(1);
  const int32_t* kb = key_begin.data<int32_t>();
  int32_t* t = out.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      if (kb[b * T + i + k] != kb[b * T + i]) t[b * n + i] = -100;
    }
  }
  return out;
}
}  // namespace

DeepSeekV3::Losses DeepSeekV3::head_losses(Tensor h, const Tensor& ids, const Tensor& targets, RoutingRecord& record,
                                           const Tensor& packed_positions, const Tensor& key_begin) const {
  const int64_t T = ids.size(1);
  Losses out;
  const Tensor head = nn::compute_value(lm_head.weight);  // [V, C], gathered when sharded
  const Tensor head_bf16 = head_bf16_copy();
  out.main = ops::linear_cross_entropy(ln_final.forward(h, lm_head), head, targets, -100, lm_head.precision, 512,
                                       head_bf16);
  out.total = out.main;
  if (!mtp.empty()) {
    Tensor sum;
    for (size_t i = 0; i < mtp.size(); ++i) {
      const int64_t k = static_cast<int64_t>(i) + 1, n = T - k;
      // Position t < n combines depth k-1's state at t with the embedding of token t+k (= ids[t+k]) and
      // predicts token t+k+1 (= targets[t+k]).
      Tensor e = token_embeddings.forward(ops::narrow(ids, 1, k, n));
      const MtpModule& m = *mtp[i];
      Tensor in = ops::concat({m.norm_h.forward(ops::narrow(h, 1, 0, n)), m.norm_e.forward(e)}, -1);  // [B, n, 2C]
      Tensor target_k = ops::narrow(targets, 1, k, n);
      if (key_begin.defined()) {  // packed rows: the first n positions keep their documents
        h = m.block.forward(m.proj.forward(in), ops::narrow(packed_positions, 1, 0, n), nullptr,
                            ops::narrow(key_begin, 1, 0, n));
        target_k = targets_within_documents(target_k, key_begin, k);
      } else {
        h = m.block.forward(m.proj.forward(in), positions(0, n), nullptr);
      }
      Tensor ce = ops::linear_cross_entropy(ln_final.forward(h, lm_head), head, target_k, -100, lm_head.precision, 512,
                                            head_bf16);
      sum = sum.defined() ? ops::add(sum, ce) : ce;
    }
    out.mtp = ops::scale(sum, 1.0f / static_cast<float>(mtp.size()));
    out.total = ops::add(out.total, ops::scale(out.mtp, config_.mtp_lambda));
  }
  if (record.balance_loss.defined()) {
    out.balance = record.balance_loss;
    out.total = ops::add(out.total, out.balance);
  }
  out.expert_load = std::move(record.expert_load);
  return out;
}

Tensor DeepSeekV3::loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx) const {
  if (ctx.training) {
    Losses l = losses(ids, targets, ctx);
    record_training(l);
    return l.total;
  }
  check_ids(ids, config_.context_length, "DeepSeekV3::loss");
  LOOM_CHECK(targets.defined() && targets.shape() == ids.shape(), "DeepSeekV3::loss: targets ", targets.describe(),
             " do not match ids ", ids.describe());
  Tensor x = trunk(ids, positions_of(ids, ctx), nullptr, ctx);
  return ops::linear_cross_entropy(ln_final.forward(x, lm_head), nn::compute_value(lm_head.weight), targets, -100,
                                   lm_head.precision, 512, head_bf16_copy());
}

Tensor DeepSeekV3::stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids,
                                 const Tensor& targets, const models::ForwardContext& ctx, Tensor* aux_loss) const {
  // losses() (training) and loss() (evaluation) cut at the block boundaries: the same calls on the same values.
  const int64_t L = config_.num_layers;
  LOOM_CHECK(0 <= first && first < last && last <= L, "DeepSeekV3::stage_forward: layers [", first, ", ", last,
             ") outside [0, ", L, ")");
  check_ids(ids, config_.context_length, "DeepSeekV3::stage_forward");
  LOOM_CHECK(!ctx.positions.defined() && !ctx.key_begin.defined(),
             "DeepSeekV3: packed rows (data.packing) are not supported on a pipe axis");
  const int64_t T = ids.size(1);
  RoutingRecord record;
  RoutingRecord* rec = ctx.training ? &record : nullptr;
  Tensor h = blocks(first == 0 ? token_embeddings.forward(ids) : x, first, last, positions(0, T), rec, ctx);
  if (ctx.training) {
    size_t offset = 0;  // the MoE layers before this stage
    for (int64_t i = 0; i < first; ++i) offset += layers[static_cast<size_t>(i)]->moe ? 1 : 0;
    record_stage_loads(record.expert_load, offset);
  }
  if (last < L) {
    if (aux_loss != nullptr) *aux_loss = record.balance_loss;
    return h;
  }
  if (!ctx.training) {
    return ops::linear_cross_entropy(ln_final.forward(h, lm_head), nn::compute_value(lm_head.weight), targets, -100,
                                     lm_head.precision, 512, head_bf16_copy());
  }
  LOOM_CHECK(targets.defined() && targets.shape() == ids.shape(), "DeepSeekV3::stage_forward: targets ",
             targets.describe(), " do not match ids ", ids.describe());
  LOOM_CHECK(T > config_.n_mtp, "DeepSeekV3::stage_forward: sequence length ", T, " leaves no position for model.n_mtp=",
             config_.n_mtp, " prediction modules (needs T > n_mtp)");
  Losses l = head_losses(h, ids, targets, record);
  record_window(l);
  return l.total;
}

int DeepSeekV3::pipeline_ends(const nn::Parameter& p) const {
  if (&p == &token_embeddings.weight) return mtp.empty() ? 1 : 3;  // MTP embeds the shifted tokens
  return models::LanguageModel::pipeline_ends(p);
}

Tensor DeepSeekV3::head_bf16_copy() const {
  // Mixed precision: the head's bf16 weight copy, which the optimizer keeps current (nn::bf16_weight_of).
  const bool bf16_copy = lm_head.precision == ops::MatmulPrecision::BF16 && !lm_head.weight.dist;
  return bf16_copy ? nn::bf16_weight_of(lm_head.weight) : Tensor();
}

std::unique_ptr<LatentCache> DeepSeekV3::make_latent_cache(int64_t batch, bool absorbed) const {
  return std::make_unique<LatentCache>(config_, batch, absorbed);
}

std::unique_ptr<nn::DecodeCache> DeepSeekV3::make_decode_cache(int64_t batch) const {
  return make_latent_cache(batch, /*absorbed=*/true);
}

Tensor DeepSeekV3::decode(const Tensor& ids, nn::DecodeCache& cache_base) const {
  auto* cache = dynamic_cast<LatentCache*>(&cache_base);
  LOOM_CHECK(cache != nullptr, "DeepSeekV3::decode: the cache was not made by this model's make_decode_cache");
  check_dtype(ids, DType::I32, "DeepSeekV3::decode", "ids");
  check_ndim(ids, 2, "DeepSeekV3::decode", "ids");
  const int64_t t = ids.size(1), start = cache->length();
  LOOM_CHECK(ids.size(0) == cache->batch(), "DeepSeekV3::decode: ids have batch ", ids.size(0),
             ", the cache was made for ", cache->batch());
  LOOM_CHECK(t >= 1 && start + t <= config_.context_length, "DeepSeekV3::decode: ", start, " cached + ", t,
             " new tokens exceed context_length ", config_.context_length);
  autograd::NoGradGuard no_grad;
  Tensor pos = positions(start, t);
  Tensor x = token_embeddings.forward(ids);
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, pos, *cache, static_cast<int64_t>(i));
  cache->advance(t);
  return lm_head.forward(ln_final.forward(x, lm_head));
}

std::optional<nn::DecoderWeights> DeepSeekV3::decoder_weights() const {
  const Config& c = config_;
  nn::DecoderWeights w;
  w.num_heads = c.num_heads;
  w.num_kv_heads = 1;  // one latent slot per position
  w.context_length = c.context_length;
  // Any part that cannot be described leaves the model to the per-sequence path.
  auto ok = [](const std::string& why) { return why.empty(); };
  if (!ok(nn::describe_plain(token_embeddings.weight, w.token_embeddings)) ||
      !ok(nn::describe_plain(ln_final.weight, w.final_norm)) || !ok(nn::describe_linear(lm_head, w.head))) {
    return std::nullopt;
  }
  w.final_norm_eps = ln_final.eps;
  // A matrix split per expert: expert e's [rows, cols] slice of an [E, rows, cols] parameter.
  auto expert = [](const nn::Parameter& p, int64_t e) {
    nn::DecoderMatrix m;
    m.f32 = p.value.slice(e, 1).view({p.value.size(1), p.value.size(2)});
    return m;
  };
  for (const auto& layer : layers) {
    const Block& b = *layer;
    const MultiHeadLatentAttention& a = b.attn;
    nn::DecoderLayerWeights l;
    nn::LatentAttentionWeights m;
    m.q_rank = c.q_rank, m.kv_rank = c.kv_rank, m.d_nope = c.d_nope, m.d_rope = c.d_rope;
    // The folded weights are computed from wkv_b's and wo's f32 values.
    nn::DecoderMatrix wkv_b, wo;
    if (!ok(nn::describe_linear(a.wq_a, m.wq_a)) || !ok(nn::describe_linear(a.wq_b, m.wq_b)) ||
        !ok(nn::describe_linear(a.wkv_a, m.wkv_a)) || !ok(nn::describe_linear(a.wkv_b, wkv_b)) ||
        !ok(nn::describe_linear(a.wo, wo)) || !wkv_b.f32.defined() || !wo.f32.defined() ||
        !ok(nn::describe_plain(a.q_norm.weight, m.q_norm)) || !ok(nn::describe_plain(a.kv_norm.weight, m.kv_norm)) ||
        !ok(nn::describe_plain(b.attn_norm.weight, l.attn_norm)) || !ok(nn::describe_plain(b.ffn_norm.weight, l.ffn_norm))) {
      return std::nullopt;
    }
    m.q_norm_eps = a.q_norm.eps;
    m.kv_norm_eps = a.kv_norm.eps;
    const LatentCache::Absorbed folded = a.absorb();  // w_uk [H, N, Rk], wo_abs [C, H*Rk]
    const int64_t N = c.d_nope, Rk = c.kv_rank;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      nn::DecoderMatrix t;  // W_UK[h] transposed: [Rk, N], so that q_abs = row_linear(q_nope, t)
      t.f32 = Tensor::empty({Rk, N});
      const float* src = folded.w_uk.data<float>() + h * N * Rk;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t r = 0; r < Rk; ++r) t.f32.data<float>()[r * N + n] = src[n * Rk + r];
      }
      m.w_uk.push_back(std::move(t));
    }
    m.wo_abs.f32 = folded.wo_abs;
    m.scale = a.scale;
    m.rope = a.rope_cache;
    l.mla = std::move(m);
    l.attn_norm_eps = b.attn_norm.eps;
    l.ffn_norm_eps = b.ffn_norm.eps;
    if (b.mlp) {
      if (!ok(nn::describe_linear(b.mlp->w1, l.w1)) || !ok(nn::describe_linear(b.mlp->w3, l.w3)) ||
          !ok(nn::describe_linear(b.mlp->w2, l.w2))) {
        return std::nullopt;
      }
    } else {
      const MoE& moe = *b.moe;
      for (const nn::Parameter* p : {&moe.w1, &moe.w3, &moe.w2}) {
        if (p->dist || p->value.dtype() != DType::F32 || !p->value.device().is_cpu()) return std::nullopt;
      }
      nn::MoeWeights e;
      if (!ok(nn::describe_linear(moe.router, e.router))) return std::nullopt;
      e.bias = moe.bias;
      e.top_k = moe.top_k;
      e.route_scale = moe.route_scale;
      for (int64_t i = 0; i < c.n_routed; ++i) {
        e.w1.push_back(expert(moe.w1, i));
        e.w3.push_back(expert(moe.w3, i));
        e.w2.push_back(expert(moe.w2, i));
      }
      if (moe.shared) {
        if (!ok(nn::describe_linear(moe.shared->w1, e.shared_w1)) || !ok(nn::describe_linear(moe.shared->w3, e.shared_w3)) ||
            !ok(nn::describe_linear(moe.shared->w2, e.shared_w2))) {
          return std::nullopt;
        }
      }
      l.ffn = nn::DecoderFfn::MoE;
      l.moe = std::move(e);
    }
    w.layers.push_back(std::move(l));
  }
  w.check();
  return w;
}

void DeepSeekV3::set_matmul_precision(ops::MatmulPrecision precision) {
  // The norms and SwiGLU gates that feed only bf16 GEMMs write their outputs in bf16 themselves.
  const bool bf16 = precision == ops::MatmulPrecision::BF16;
  auto attn_and_ffn = [precision, bf16](Block& b) {
    for (nn::Linear* l : {&b.attn.wq_a, &b.attn.wq_b, &b.attn.wkv_a, &b.attn.wkv_b, &b.attn.wo}) l->precision = precision;
    b.attn_norm.bf16_output = b.ffn_norm.bf16_output = b.attn.q_norm.bf16_output = bf16;
    if (b.mlp) {
      for (nn::Linear* l : {&b.mlp->w1, &b.mlp->w2, &b.mlp->w3}) l->precision = precision;
      b.mlp->bf16_output = bf16;
    }
    if (b.moe) {
      b.moe->precision = precision;  // the router stays f32
      if (b.moe->shared) {
        for (nn::Linear* l : {&b.moe->shared->w1, &b.moe->shared->w2, &b.moe->shared->w3}) l->precision = precision;
        b.moe->shared->bf16_output = bf16;
      }
    }
  };
  for (auto& layer : layers) attn_and_ffn(*layer);
  for (auto& m : mtp) {
    m->proj.precision = precision;
    attn_and_ffn(m->block);
  }
  lm_head.precision = precision;
  ln_final.bf16_output = bf16;
}

std::vector<std::pair<std::string, Tensor>> DeepSeekV3::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (MoE* m : moe_layers()) out.emplace_back(m->bias_name, m->bias);
  return out;
}

namespace {
void add_counts(std::vector<std::vector<int64_t>>& into, const std::vector<Tensor>& loads) {
  if (into.size() != loads.size()) into.assign(loads.size(), {});
  for (size_t l = 0; l < loads.size(); ++l) {
    const int32_t* p = loads[l].data<int32_t>();
    if (into[l].size() != static_cast<size_t>(loads[l].numel())) into[l].assign(static_cast<size_t>(loads[l].numel()), 0);
    for (int64_t e = 0; e < loads[l].numel(); ++e) into[l][static_cast<size_t>(e)] += p[e];
  }
}

void add_counts_from(std::vector<std::vector<int64_t>>& into, const std::vector<std::vector<int64_t>>& counts) {
  if (into.size() != counts.size()) into.assign(counts.size(), {});
  for (size_t l = 0; l < counts.size(); ++l) {
    if (into[l].size() != counts[l].size()) into[l].assign(counts[l].size(), 0);
    for (size_t e = 0; e < counts[l].size(); ++e) into[l][e] += counts[l][e];
  }
}
}  // namespace

void DeepSeekV3::record_training(const Losses& l) const {
  {
    std::lock_guard<std::mutex> lock(training_mutex_);
    add_counts(step_load_, l.expert_load);
    if (!rank_context()) add_counts(window_load_, l.expert_load);  // sharded: the global loads, at the step's end
  }
  record_window(l);
}

void DeepSeekV3::record_stage_loads(const std::vector<Tensor>& loads, size_t offset) const {
  std::lock_guard<std::mutex> lock(training_mutex_);
  const size_t n = moe_layers().size();
  if (step_load_.size() != n) step_load_.assign(n, std::vector<int64_t>(static_cast<size_t>(config_.n_routed), 0));
  for (size_t k = 0; k < loads.size(); ++k) {
    const int32_t* p = loads[k].data<int32_t>();
    for (int64_t e = 0; e < loads[k].numel(); ++e) step_load_[offset + k][static_cast<size_t>(e)] += p[e];
  }
}

void DeepSeekV3::record_window(const Losses& l) const {
  std::lock_guard<std::mutex> lock(training_mutex_);
  window_main_ += l.main.item();
  if (l.mtp.defined()) window_mtp_ += l.mtp.item();
  if (l.balance.defined()) window_balance_ += l.balance.item();
  ++window_batches_;
}

void DeepSeekV3::begin_training_step() {
  std::lock_guard<std::mutex> lock(training_mutex_);
  step_load_.clear();
}

const dist::RankContext* DeepSeekV3::rank_context() const {
  return token_embeddings.weight.dist.get();  // shard_model points every parameter at the same context
}

void DeepSeekV3::end_training_step(bool applied) {
  std::lock_guard<std::mutex> lock(training_mutex_);
  const std::vector<MoE*> moes = moe_layers();
  if (const dist::RankContext* c = rank_context()) {
    // The global loads: every rank that splits the batch adds its counts, in group order, so every rank
    // updates the same biases as one process would (exact: integer counts well below 2^53).
    // Under a pipe axis each stage counted only its own MoE layers (zeros elsewhere): the stages' sum is
    // every layer's count, exactly, on every rank.
    std::vector<dist::MeshAxis> axes = dist::batch_axes(c->mode);
    if (c->mesh.pipe > 1) {
      axes.push_back(dist::MeshAxis::Pipe);
      if (step_load_.size() != moes.size()) {
        step_load_.assign(moes.size(), std::vector<int64_t>(static_cast<size_t>(config_.n_routed), 0));
      }
    }
    const dist::Group batch{c->comm, c->mesh.group(c->rank, axes)};
    std::vector<double> flat;
    for (const auto& layer : step_load_) flat.insert(flat.end(), layer.begin(), layer.end());
    if (batch.size() > 1 && !flat.empty()) c->comm->all_reduce_sum(flat.data(), static_cast<int64_t>(flat.size()), batch.ranks);
    size_t at = 0;
    for (auto& layer : step_load_) {
      for (int64_t& v : layer) v = static_cast<int64_t>(flat[at++]);
    }
    add_counts_from(window_load_, step_load_);
  }
  if (applied && config_.gamma > 0 && step_load_.size() == moes.size()) {
    const int64_t E = config_.n_routed;
    for (size_t l = 0; l < moes.size(); ++l) {
      int64_t total = 0;
      for (int64_t c : step_load_[l]) total += c;
      float* b = moes[l]->bias.data<float>();
      for (int64_t e = 0; e < E; ++e) {
        // sign(mean - load_e) = sign(total / E - count_e) = sign(total - E * count_e), in integers.
        const int64_t diff = total - E * step_load_[l][static_cast<size_t>(e)];
        const float s = diff > 0 ? 1.0f : diff < 0 ? -1.0f : 0.0f;
        b[e] = b[e] + config_.gamma * s;
      }
    }
  }
  step_load_.clear();
}

nlohmann::json DeepSeekV3::take_training_metrics() {
  std::lock_guard<std::mutex> lock(training_mutex_);
  nlohmann::json j = nlohmann::json::object();
  if (window_batches_ > 0) {  // under a pipe axis only the last stage computes them
    const double n = static_cast<double>(window_batches_);
    j["main_loss"] = window_main_ / n;
    if (!mtp.empty()) j["mtp_loss"] = window_mtp_ / n;
    j["balance_loss"] = window_balance_ / n;
  }
  if (window_batches_ > 0 || !window_load_.empty()) {  // a training pass ran (a pipe's first stages: the latter only)
    nlohmann::json lo = nlohmann::json::array(), hi = nlohmann::json::array();
    for (const auto& counts : window_load_) {
      int64_t total = 0, mn = counts.empty() ? 0 : counts[0], mx = mn;
      for (int64_t c : counts) {
        total += c;
        mn = std::min(mn, c);
        mx = std::max(mx, c);
      }
      lo.push_back(total > 0 ? static_cast<double>(mn) / static_cast<double>(total) : 0.0);
      hi.push_back(total > 0 ? static_cast<double>(mx) / static_cast<double>(total) : 0.0);
    }
    j["expert_load_min"] = lo;
    j["expert_load_max"] = hi;
  }
  nlohmann::json bmin = nlohmann::json::array(), bmax = nlohmann::json::array();
  for (MoE* m : moe_layers()) {
    const float* b = m->bias.data<float>();
    float mn = b[0], mx = b[0];
    for (int64_t e = 1; e < m->bias.numel(); ++e) {
      mn = std::min(mn, b[e]);
      mx = std::max(mx, b[e]);
    }
    bmin.push_back(io::float_for_json(mn));  // the f32 value's shortest decimal
    bmax.push_back(io::float_for_json(mx));
  }
  if (!bmin.empty()) {
    j["bias_min"] = bmin;
    j["bias_max"] = bmax;
  }
  window_load_.clear();
  window_main_ = window_mtp_ = window_balance_ = 0;
  window_batches_ = 0;
  return j;
}

}  // namespace loom::deepseek_v3
