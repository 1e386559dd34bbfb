#include "models/deepseek_v3/mla.h"

#include <cmath>
#include <cstring>

#include "core/autograd.h"
#include "nn/sharded.h"
#include "ops/attention.h"
#include "ops/matmul.h"
#include "ops/mla.h"
#include "ops/rope.h"
#include "ops/shape.h"

namespace loom::deepseek_v3 {

namespace {
constexpr ops::RopeStyle kRopeStyle = ops::RopeStyle::RotateHalf;  // the seed's apply_rope splits halves

// RoPE positions for per-head queries [B, H, T, P]: [T] as given; packed rows' [B, T] repeated per head
// (ops::rope takes [T] or the leading shape [B, H, T]).
Tensor head_positions(const Tensor& positions, int64_t heads) {
  if (positions.ndim() == 1) return positions;
  const int64_t B = positions.size(0), T = positions.size(1);
  Tensor out = Tensor::empty({B, heads, T}, DType::I32);
  const int32_t* src = positions.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < heads; ++h) std::memcpy(dst + (b * heads + h) * T, src + b * T, static_cast<size_t>(T) * sizeof(int32_t));
  }
  return out;
}
}  // namespace

LatentCache::LatentCache(const Config& c, int64_t batch, bool absorbed)
    : batch_(batch), capacity_(c.context_length), width_(c.latent_cache_floats_per_layer()), absorbed_(absorbed) {
  LOOM_CHECK(batch > 0, "LatentCache: batch must be positive, got ", batch);
  for (int64_t l = 0; l < c.num_layers; ++l) layers_.push_back(Tensor::zeros({batch, capacity_, width_}));
  absorbed_weights.resize(static_cast<size_t>(c.num_layers));
}

Tensor LatentCache::append(int64_t layer, const Tensor& latent) {
  LOOM_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()), "LatentCache: layer ", layer,
             " out of range [0, ", layers_.size(), ")");
  check_ndim(latent, 3, "LatentCache::append", "latent");
  const int64_t t = latent.size(1);
  LOOM_CHECK(latent.size(0) == batch_ && latent.size(2) == width_, "LatentCache: latent ", latent.describe(),
             " does not fit a cache of batch ", batch_, " and width ", width_);
  LOOM_CHECK(length_ + t <= capacity_, "LatentCache: ", length_, " cached + ", t, " new tokens exceed capacity ",
             capacity_);
  Tensor& store = layers_[static_cast<size_t>(layer)];
  const float* src = latent.data<float>();
  float* dst = store.data<float>();
  for (int64_t b = 0; b < batch_; ++b) {
    std::memcpy(dst + (b * capacity_ + length_) * width_, src + b * t * width_,
                static_cast<size_t>(t * width_) * sizeof(float));
  }
  return ops::narrow(store, 1, 0, length_ + t);
}

void LatentCache::advance(int64_t t) {
  LOOM_CHECK(t >= 0 && length_ + t <= capacity_, "LatentCache: cannot advance ", length_, " by ", t,
             " past capacity ", capacity_);
  length_ += t;
}

MultiHeadLatentAttention::MultiHeadLatentAttention(const std::string& name, const Config& c, RngKey key)
    : num_heads(c.num_heads),
      d_nope(c.d_nope),
      d_rope(c.d_rope),
      d_v(c.d_v),
      kv_rank(c.kv_rank),
      scale(1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()))),
      wq_a(nn::join(name, "wq_a"), c.d_model, c.q_rank, key, nn::Init::normal(c.init_std), false),
      q_norm(nn::join(name, "q_norm"), c.q_rank, c.norm_eps),
      wq_b(nn::join(name, "wq_b"), c.q_rank, c.num_heads * c.qk_head_dim(), key, nn::Init::normal(c.init_std), false),
      wkv_a(nn::join(name, "wkv_a"), c.d_model, c.kv_rank + c.d_rope, key, nn::Init::normal(c.init_std), false),
      kv_norm(nn::join(name, "kv_norm"), c.kv_rank, c.norm_eps),
      wkv_b(nn::join(name, "wkv_b"), c.kv_rank, c.num_heads * (c.d_nope + c.d_v), key, nn::Init::normal(c.init_std),
            false),
      wo(nn::join(name, "wo"), c.num_heads * c.d_v, c.d_model, key, nn::Init::normal(c.init_std), false),
      rope_cache(ops::make_rope_cache(c.context_length, c.d_rope, c.rope_theta)) {
  wo.weight.group = nn::ParamGroup::DenseOut;
  // The down-projections feed norms (q_norm, kv_norm) and the RoPE key every head shares: tensor
  // parallelism keeps them whole and splits the heads of wq_b, wkv_b and wo (docs/mesh.md).
  wq_a.weight.group = nn::ParamGroup::DenseInWhole;
  wkv_a.weight.group = nn::ParamGroup::DenseInWhole;
  for (Module* m : std::initializer_list<Module*>{&wq_a, &q_norm, &wq_b, &wkv_a, &kv_norm, &wkv_b, &wo}) add_child(m);
}

void MultiHeadLatentAttention::queries(const Tensor& x, const Tensor& positions, Tensor* q_nope, Tensor* q_rope) const {
  const int64_t B = x.size(0), T = x.size(1);
  Tensor q = wq_b.forward(q_norm.forward(wq_a.forward(x), wq_b));                // [B, T, H*(N+P)]
  const int64_t H = q.size(-1) / (d_nope + d_rope);  // this rank's heads under tensor parallelism
  q = ops::transpose(ops::reshape(q, {B, T, H, d_nope + d_rope}), 1, 2);  // [B, H, T, N+P]
  *q_nope = ops::narrow(q, -1, 0, d_nope);
  *q_rope = ops::rope(ops::narrow(q, -1, d_nope, d_rope), head_positions(positions, H), rope_cache, kRopeStyle);
}

Tensor MultiHeadLatentAttention::latent(const Tensor& x, const Tensor& positions) const {
  Tensor kv_a = wkv_a.forward(x);                                                            // [B, T, R+P]
  Tensor c = kv_norm.forward(ops::narrow(kv_a, -1, 0, kv_rank));                           // [B, T, R]
  Tensor k_rope = ops::rope(ops::narrow(kv_a, -1, kv_rank, d_rope), positions, rope_cache, kRopeStyle);  // [B, T, P]
  return ops::concat({c, k_rope}, -1);
}

Tensor MultiHeadLatentAttention::attend(const Tensor& q_nope, const Tensor& q_rope, const Tensor& latents,
                                        const Tensor& key_begin) const {
  const int64_t B = latents.size(0), S = latents.size(1), T = q_nope.size(2);
  Tensor c = ops::narrow(latents, -1, 0, kv_rank);            // [B, S, R]
  // Under tensor parallelism this rank's heads use the shared key: its gradient sums over the ranks (f).
  Tensor k_rope = dist::enter_tensor_split(ops::narrow(latents, -1, kv_rank, d_rope), wkv_b.weight);  // [B, S, P]
  Tensor kv_b = wkv_b.forward(c);                             // [B, S, H*(N+Dv)], this rank's heads
  const int64_t H = kv_b.size(-1) / (d_nope + d_v);
  Tensor kv = ops::transpose(ops::reshape(kv_b, {B, S, H, d_nope + d_v}), 1, 2);  // [B,H,S,N+Dv]
  Tensor k_nope = ops::narrow(kv, -1, 0, d_nope);             // [B, H, S, N]
  Tensor v = ops::narrow(kv, -1, d_nope, d_v);                // [B, H, S, Dv]
  // Every head sees the same RoPE key.
  Tensor shared = ops::reshape(k_rope, {B, 1, S, d_rope});
  Tensor k = ops::concat({k_nope, ops::concat(TensorList(static_cast<size_t>(H), shared), 1)}, -1);
  Tensor q = ops::concat({q_nope, q_rope}, -1);               // [B, H, T, N+P]
  // Mixed precision reaches the attention products too (as SDPA under autocast): wkv_b's precision.
  Tensor o = ops::scaled_dot_product_attention(q, k, v, Tensor(), /*causal=*/true, scale, wkv_b.precision,
                                               key_begin);  // [B, H, T, Dv]
  return ops::reshape(ops::transpose(o, 1, 2), {B, T, H * d_v});
}

Tensor MultiHeadLatentAttention::forward(const Tensor& x, const Tensor& positions, const Tensor& key_begin) const {
  check_ndim(x, 3, "MultiHeadLatentAttention", "x");
  const int64_t B = x.size(0), T = x.size(1);
  // As queries(), latent() and attend() compose it, with the head layouts built in one op each
  // (query_heads, key_value_heads) and the latent never concatenated: the same values.
  Tensor q = wq_b.forward(q_norm.forward(wq_a.forward(x), wq_b));  // [B, T, H*(N+P)]
  const int64_t H = q.size(-1) / (d_nope + d_rope);                // this rank's heads under tensor parallelism
  Tensor qh = ops::mla_query_heads(q, H, d_nope, d_rope, positions, rope_cache);  // [B, H, T, N+P]
  Tensor kv_a = wkv_a.forward(x);                                         // [B, T, R+P]
  Tensor c = kv_norm.forward(ops::narrow(kv_a, -1, 0, kv_rank));         // [B, T, R]
  // Under tensor parallelism this rank's heads use the shared key: its gradient sums over the ranks (f).
  Tensor k_rope = dist::enter_tensor_split(ops::narrow(kv_a, -1, kv_rank, d_rope), wkv_b.weight);  // [B, T, P]
  auto [k, v] = ops::mla_key_value_heads(wkv_b.forward(c), k_rope, H, d_nope, d_v, positions, rope_cache);  // [B, H, T, *]
  Tensor o = ops::scaled_dot_product_attention(qh, k, v, Tensor(), /*causal=*/true, scale, wkv_b.precision,
                                               key_begin);  // [B, H, T, Dv]
  return wo.forward(ops::reshape(ops::transpose(o, 1, 2), {B, T, H * d_v}));
}

LatentCache::Absorbed MultiHeadLatentAttention::absorb() const {
  const int64_t H = num_heads, N = d_nope, R = kv_rank, Dv = d_v;
  const int64_t C = wo.weight.value.size(0);
  const float* wkv = wkv_b.weight.value.data<float>();  // [H*(N+Dv), R]
  const float* w_o = wo.weight.value.data<float>();     // [C, H*Dv]
  LatentCache::Absorbed a;
  a.w_uk = Tensor::empty({H, N, R});
  float* uk = a.w_uk.data<float>();
  for (int64_t h = 0; h < H; ++h) {
    std::memcpy(uk + h * N * R, wkv + h * (N + Dv) * R, static_cast<size_t>(N * R) * sizeof(float));
  }
  // wo_abs[c, h*R + r] = sum_j wo[c, h*Dv + j] * W_UV[h][j, r], W_UV[h][j] = wkv_b row h*(N+Dv) + N + j.
  a.wo_abs = Tensor::zeros({C, H * R});
  float* out = a.wo_abs.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t h = 0; h < H; ++h) {
      float* row = out + c * H * R + h * R;
      for (int64_t j = 0; j < Dv; ++j) {
        const float w = w_o[c * H * Dv + h * Dv + j];
        const float* uv = wkv + (h * (N + Dv) + N + j) * R;
        for (int64_t r = 0; r < R; ++r) row[r] += w * uv[r];
      }
    }
  }
  return a;
}

Tensor MultiHeadLatentAttention::attend_absorbed(const Tensor& q_nope, const Tensor& q_rope, const Tensor& latents,
                                                 const LatentCache::Absorbed& w) const {
  const int64_t B = q_nope.size(0), H = num_heads, T = q_nope.size(2), S = latents.size(1);
  // q_abs = q_nope W_UK per head, batched over heads: [H, B*T, N] @ [H, N, R].
  Tensor qn = ops::reshape(ops::transpose(q_nope, 0, 1), {H, B * T, d_nope});
  Tensor q_abs = ops::transpose(ops::reshape(ops::matmul(qn, w.w_uk), {H, B, T, kv_rank}), 0, 1);  // [B, H, T, R]
  Tensor q = ops::concat({q_abs, q_rope}, -1);                                     // [B, H, T, R+P]
  Tensor k = ops::reshape(latents, {B, 1, S, kv_rank + d_rope});                   // one key head for all
  Tensor v = ops::reshape(ops::narrow(latents, -1, 0, kv_rank), {B, 1, S, kv_rank});
  Tensor o = ops::scaled_dot_product_attention(q, k, v, Tensor(), /*causal=*/true, scale);  // [B, H, T, R]
  o = ops::reshape(ops::transpose(o, 1, 2), {B, T, H * kv_rank});
  return ops::linear(o, w.wo_abs);                                                 // [B, T, C]
}

Tensor MultiHeadLatentAttention::forward_cached(const Tensor& x, const Tensor& positions, LatentCache& cache,
                                                int64_t layer) const {
  autograd::NoGradGuard no_grad;
  check_ndim(x, 3, "MultiHeadLatentAttention", "x");
  Tensor latents = cache.append(layer, latent(x, positions));  // [B, S, R+P]
  Tensor q_nope, q_rope;
  queries(x, positions, &q_nope, &q_rope);
  if (!cache.absorbed()) return wo.forward(attend(q_nope, q_rope, latents));
  LatentCache::Absorbed& w = cache.absorbed_weights[static_cast<size_t>(layer)];
  if (!w.w_uk.defined()) w = absorb();
  return attend_absorbed(q_nope, q_rope, latents, w);
}

}  // namespace loom::deepseek_v3
