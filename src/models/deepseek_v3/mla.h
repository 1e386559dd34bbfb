// Multi-head latent attention (DeepSeek-V2/V3, as the seed's `mla`), and its latent decode cache.
//
// Legend: B batch, T sequence (S keys), C d_model, H heads, Q q_rank, R kv_rank, N d_nope, P d_rope,
// Dv d_v.
//   queries:  q = wq_b(q_norm(wq_a x)) -> per head [N | P]; the P part rotated (RoPE)
//   latent:   [c | k_rope] = wkv_a x;  c = kv_norm(c) [R];  k_rope rotated [P], one key shared by heads
//   keys/values: wkv_b c -> per head [k_nope N | v Dv];  key = [k_nope | k_rope]
//   out = wo(softmax(q.k / sqrt(N + P)) v)
// RoPE is the seed's rotate-half layout (pairs x[i], x[i + P/2]), theta^(-2i/P).
// Parameter names (Linear weights [out, in]): attn.wq_a [Q, C], attn.q_norm [Q], attn.wq_b [H*(N+P), Q],
// attn.wkv_a [R+P, C], attn.kv_norm [R], attn.wkv_b [H*(N+Dv), R], attn.wo [C, H*Dv].
//
// Decoding keeps only [c | k_rope] per token and layer (R + P numbers). Two ways to attend from it:
//   * naive: rebuild every head's k_nope and v from the cached c with wkv_b, then attend;
//   * absorbed: fold W_UK (wkv_b's k_nope rows) into the query, q_abs = q_nope W_UK [R], so that
//     q.k = q_abs.c + q_rope.k_rope: one "head" of keys [c | k_rope] shared by all H queries; the
//     attention's output is in latent space [R] per head, and W_UV (wkv_b's v rows) is folded into wo,
//     wo_abs [C, H*R]. Per-head K and V never exist.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/decode_cache.h"
#include "models/deepseek_v3/config.h"
#include "nn/layers.h"

namespace loom::deepseek_v3 {

// Per layer, [B, capacity, R + P]: the normalised latent c and the rotated shared RoPE key of every
// token fed so far. With `absorbed`, decoding uses the absorbed form; its folded weights are computed
// from the model's weights the first time a layer decodes, so a cache belongs to one set of weights.
class LatentCache : public nn::DecodeCache {
 public:
  LatentCache(const Config& config, int64_t batch, bool absorbed);
  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  void clear() override { length_ = 0; }
  int64_t batch() const { return batch_; }
  bool absorbed() const { return absorbed_; }
  // Writes latent [B, t, R+P] at positions length()..length()+t-1 of `layer`, and returns that layer's
  // first length()+t entries [B, length()+t, R+P] (a copy). advance() moves length() once every layer
  // has been written.
  Tensor append(int64_t layer, const Tensor& latent);
  void advance(int64_t t);
  // Floats held per token (all layers).
  int64_t floats_per_token() const { return static_cast<int64_t>(layers_.size()) * width_; }

  struct Absorbed {
    Tensor w_uk;    // [H, N, R]: q_abs = q_nope @ w_uk[h]
    Tensor wo_abs;  // [C, H*R]:  out = o_latent @ wo_abs^T
  };
  std::vector<Absorbed> absorbed_weights;  // per layer, filled on first use

 private:
  int64_t batch_, capacity_, width_, length_ = 0;
  bool absorbed_;
  std::vector<Tensor> layers_;
};

class MultiHeadLatentAttention : public nn::Module {
 public:
  MultiHeadLatentAttention(const std::string& name, const Config& c, RngKey key);
  // x: [B, T, C]; positions: i32 [T], or [B, T] for packed rows (restarting per document) with
  // key_begin i32 [B, T] (document masking: ops::scaled_dot_product_attention). Causal. Returns [B, T, C].
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& key_begin = Tensor()) const;
  // Decoding (no autodiff): x [B, t, C] are the next t tokens at `positions` [t]; their latents are
  // appended to `cache` layer `layer` and they attend causally to everything cached.
  Tensor forward_cached(const Tensor& x, const Tensor& positions, LatentCache& cache, int64_t layer) const;
  // The absorbed form's folded weights, from wkv_b and wo (f32, unsharded): the decode cache's, and
  // batched serving's (DeepSeekV3::decoder_weights).
  LatentCache::Absorbed absorb() const;

  int64_t num_heads, d_nope, d_rope, d_v, kv_rank;
  float scale;  // 1/sqrt(d_nope + d_rope)
  nn::Linear wq_a;
  nn::RMSNorm q_norm;
  nn::Linear wq_b, wkv_a;
  nn::RMSNorm kv_norm;
  nn::Linear wkv_b, wo;
  ops::RopeCache rope_cache;

 private:
  // q_nope [B, H, T, N] and the rotated q_rope [B, H, T, P].
  void queries(const Tensor& x, const Tensor& positions, Tensor* q_nope, Tensor* q_rope) const;
  // [c | rotated k_rope]: [B, T, R+P].
  Tensor latent(const Tensor& x, const Tensor& positions) const;
  // Attention over latents [B, S, R+P] (the queries are the last T of the S positions), rebuilding
  // per-head keys and values: [B, T, H*Dv] before wo. key_begin: forward's.
  Tensor attend(const Tensor& q_nope, const Tensor& q_rope, const Tensor& latents,
                const Tensor& key_begin = Tensor()) const;
  // The absorbed form, decoding only: [B, T, C] after the folded output projection.
  Tensor attend_absorbed(const Tensor& q_nope, const Tensor& q_rope, const Tensor& latents,
                         const LatentCache::Absorbed& w) const;
};

}  // namespace loom::deepseek_v3
