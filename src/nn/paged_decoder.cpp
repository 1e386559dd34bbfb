#include "nn/paged_decoder.h"

#include <cmath>
#include <cstring>

#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/row_linear.h"
#include "quant/linear.h"

namespace loom::nn {

Tensor DecoderMatrix::apply(const Tensor& x) const {
  if (quantized) return quant::quantized_linear(x, *quantized, bias, "decoder matrix");
  Tensor y = ops::row_linear(x, f32);
  if (bias.defined()) {  // y[m] += bias: the same additions for every row
    const int64_t M = y.size(0), N = y.size(1);
    float* out = y.data<float>();
    const float* b = bias.data<float>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) out[m * N + n] = out[m * N + n] + b[n];
    }
  }
  return y;
}

namespace {

void check_vector(const Tensor& t, int64_t n, const std::string& name);

void check_matrix(const DecoderMatrix& m, int64_t rows, int64_t cols, const std::string& name) {
  LOOM_CHECK(m.quantized != nullptr || m.f32.defined(), "decoder weights: ", name, " is missing");
  LOOM_CHECK(!(m.quantized != nullptr && m.f32.defined()), "decoder weights: ", name,
             " is given both f32 and quantized");
  if (m.quantized) {
    LOOM_CHECK(quant::has_matmul_kernels(m.quantized->type()), "decoder weights: ", name, " has type ",
               quant::quant_type_name(m.quantized->type()), ", which has no matmul kernels");
  } else {
    LOOM_CHECK(m.f32.dtype() == DType::F32 && m.f32.ndim() == 2 && m.f32.device().is_cpu(), "decoder weights: ", name,
               " must be an f32 CPU matrix, got ", m.f32.describe());
  }
  LOOM_CHECK(m.rows() == rows && m.cols() == cols, "decoder weights: ", name, " is [", m.rows(), ", ", m.cols(),
             "], expected [", rows, ", ", cols, "]");
  if (m.bias.defined()) check_vector(m.bias, rows, name + ".bias");
}

void check_vector(const Tensor& t, int64_t n, const std::string& name) {
  LOOM_CHECK(t.defined() && t.dtype() == DType::F32 && t.device().is_cpu() && t.shape() == Shape({n}),
             "decoder weights: ", name, " must be f32 [", n, "] on the CPU, got ", t.defined() ? t.describe() : "nothing");
}

}  // namespace

std::string describe_plain(const Parameter& p, Tensor& out) {
  const Tensor& v = p.value;
  if (p.dist || v.dtype() != DType::F32 || !v.device().is_cpu()) return p.name + " is not a plain f32 CPU tensor";
  out = v;
  return "";
}

std::string describe_linear(const Linear& l, DecoderMatrix& out) {
  if (l.weight.dist) return l.weight.name + " is sharded over a mesh";
  if (l.lora) return l.weight.name + " has a LoRA adapter (merge it into the base first: loom merge)";
  DecoderMatrix m;
  if (l.bias != nullptr) {
    if (std::string why = describe_plain(*l.bias, m.bias); !why.empty()) return why;
  }
  if (l.quantized) {
    if (!quant::has_matmul_kernels(l.quantized->type())) return l.weight.name + " is held in a type without kernels";
    m.quantized = l.quantized;
  } else if (std::string why = describe_plain(l.weight, m.f32); !why.empty()) {
    return why;
  }
  out = std::move(m);
  return "";
}

int64_t DecoderWeights::cache_head_dim() const {
  if (latent()) return layers[0].mla->kv_rank + layers[0].mla->d_rope;
  return head_dim();
}

void DecoderWeights::check() const {
  LOOM_CHECK(token_embeddings.defined() && token_embeddings.dtype() == DType::F32 && token_embeddings.ndim() == 2 &&
                 token_embeddings.device().is_cpu(),
             "decoder weights: token_embeddings must be f32 [V, C] on the CPU");
  const int64_t C = d_model(), V = vocab_size(), H = num_heads;
  LOOM_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && C % num_heads == 0,
             "decoder weights: ", num_heads, " heads and ", num_kv_heads, " k/v heads do not fit d_model ", C);
  LOOM_CHECK(context_length > 0 && !layers.empty(), "decoder weights: no layers or no context");
  const bool layer_norm = norm == DecoderNorm::Layer;
  if (position_embeddings.defined()) {
    const Tensor& p = position_embeddings;
    LOOM_CHECK(p.dtype() == DType::F32 && p.ndim() == 2 && p.device().is_cpu() && p.size(0) >= context_length &&
                   p.size(1) == C,
               "decoder weights: position_embeddings must be f32 [>= ", context_length, ", ", C, "] on the CPU, got ",
               p.describe());
  }
  auto check_norm = [&](const Tensor& gain, const Tensor& bias, int64_t n, const std::string& name) {
    check_vector(gain, n, name);
    if (layer_norm) {
      check_vector(bias, n, name + "_bias");
    } else {
      LOOM_CHECK(!bias.defined(), "decoder weights: ", name, " is an RMSNorm and takes no bias");
    }
  };
  const int64_t D = head_dim(), Hkv = num_kv_heads;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayerWeights& l = layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    LOOM_CHECK(l.mla.has_value() == latent(), "decoder weights: ", p, "attention is ", l.mla ? "" : "not ",
               "latent (MLA) unlike layer 0's: the cache holds one kind of slot");
    if (l.mla) {
      const LatentAttentionWeights& m = *l.mla;
      const LatentAttentionWeights& first = *layers[0].mla;
      LOOM_CHECK(m.q_rank > 0 && m.kv_rank > 0 && m.d_nope > 0 && m.d_rope > 0 && m.d_rope % 2 == 0 &&
                     m.kv_rank == first.kv_rank && m.d_rope == first.d_rope,
                 "decoder weights: ", p, "MLA ranks q ", m.q_rank, ", kv ", m.kv_rank, ", d_nope ", m.d_nope,
                 ", d_rope ", m.d_rope, " must be positive, d_rope even, kv_rank and d_rope as layer 0's");
      LOOM_CHECK(Hkv == 1, "decoder weights: MLA keeps one latent slot per position: num_kv_heads must be 1, got ", Hkv);
      const int64_t Q = m.q_rank, Rk = m.kv_rank, N = m.d_nope, P = m.d_rope;
      check_matrix(m.wq_a, Q, C, p + "attn.wq_a");
      check_vector(m.q_norm, Q, p + "attn.q_norm");
      check_matrix(m.wq_b, H * (N + P), Q, p + "attn.wq_b");
      check_matrix(m.wkv_a, Rk + P, C, p + "attn.wkv_a");
      check_vector(m.kv_norm, Rk, p + "attn.kv_norm");
      LOOM_CHECK(static_cast<int64_t>(m.w_uk.size()) == H, "decoder weights: ", p, "attn.w_uk has ", m.w_uk.size(),
                 " heads, expected ", H);
      for (int64_t h = 0; h < H; ++h) check_matrix(m.w_uk[static_cast<size_t>(h)], Rk, N, p + "attn.w_uk." + std::to_string(h));
      check_matrix(m.wo_abs, C, H * Rk, p + "attn.wo_abs");
      LOOM_CHECK(m.rope.defined() && m.rope.head_dim == P && m.rope.max_len() >= context_length, "decoder weights: ", p,
                 "attn.rope must cover ", context_length, " positions of head dim ", P);
      LOOM_CHECK(std::isfinite(m.scale) && m.scale > 0, "decoder weights: ", p, "attn.scale ", m.scale,
                 " must be finite and > 0");
    } else {
      check_matrix(l.q_proj, num_heads * D, C, p + "q_proj");
      check_matrix(l.k_proj, Hkv * D, C, p + "k_proj");
      check_matrix(l.v_proj, Hkv * D, C, p + "v_proj");
      check_matrix(l.output_proj, C, num_heads * D, p + "output_proj");
      if (l.rope.defined()) {
        LOOM_CHECK(l.rope.head_dim == D && l.rope.max_len() >= context_length, "decoder weights: ", p,
                   "rope must cover ", context_length, " positions of head dim ", D);
      } else {
        LOOM_CHECK(position_embeddings.defined(), "decoder weights: ", p,
                   "attention has no RoPE and the model no learned positions: nothing says where a token is");
      }
    }
    switch (l.ffn) {
      case DecoderFfn::SwiGLU:
      case DecoderFfn::GeluTanh: {
        const int64_t F = l.w1.defined() ? l.w1.rows() : 0;
        check_matrix(l.w1, F, C, p + "w1");
        if (l.ffn == DecoderFfn::SwiGLU) {
          check_matrix(l.w3, F, C, p + "w3");
        } else {
          LOOM_CHECK(!l.w3.defined(), "decoder weights: ", p, "w3 is given to a GELU MLP, which has none");
        }
        check_matrix(l.w2, C, F, p + "w2");
        break;
      }
      case DecoderFfn::MoE: {
        LOOM_CHECK(l.moe.has_value(), "decoder weights: ", p, "is a mixture of experts without experts");
        const MoeWeights& m = *l.moe;
        const int64_t E = static_cast<int64_t>(m.w1.size());
        LOOM_CHECK(E > 0 && m.w3.size() == m.w1.size() && m.w2.size() == m.w1.size(), "decoder weights: ", p, "moe has ",
                   m.w1.size(), ", ", m.w3.size(), " and ", m.w2.size(), " experts' w1, w3, w2");
        LOOM_CHECK(m.top_k >= 1 && m.top_k <= E && std::isfinite(m.route_scale) && m.route_scale > 0,
                   "decoder weights: ", p, "moe top_k ", m.top_k, " must be in [1, ", E, "] and route_scale ",
                   m.route_scale, " finite and > 0");
        check_matrix(m.router, E, C, p + "moe.router");
        check_vector(m.bias, E, p + "moe.bias");
        const int64_t F = m.w1[0].defined() ? m.w1[0].rows() : 0;
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = p + "moe.experts." + std::to_string(e) + ".";
          check_matrix(m.w1[static_cast<size_t>(e)], F, C, x + "w1");
          check_matrix(m.w3[static_cast<size_t>(e)], F, C, x + "w3");
          check_matrix(m.w2[static_cast<size_t>(e)], C, F, x + "w2");
        }
        if (m.shared_w1.defined() || m.shared_w3.defined() || m.shared_w2.defined()) {
          const int64_t Fs = m.shared_w1.defined() ? m.shared_w1.rows() : 0;
          check_matrix(m.shared_w1, Fs, C, p + "moe.shared.w1");
          check_matrix(m.shared_w3, Fs, C, p + "moe.shared.w3");
          check_matrix(m.shared_w2, C, Fs, p + "moe.shared.w2");
        }
        break;
      }
    }
    check_norm(l.attn_norm, l.attn_norm_bias, C, p + "attn_norm");
    check_norm(l.ffn_norm, l.ffn_norm_bias, C, p + "ffn_norm");
  }
  check_norm(final_norm, final_norm_bias, C, "final_norm");
  check_matrix(head, V, C, "head");
  LOOM_CHECK(!head.bias.defined(), "decoder weights: the head takes no bias");
}

std::string DecoderWeights::fuse() {
  fused.reset();
  // The fused step is the Llama block's: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases.
  if (norm != DecoderNorm::RMS) return "the blocks use LayerNorm";
  if (position_embeddings.defined()) return "positions are learned";
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayerWeights& l = layers[i];
    const std::string p = "layer " + std::to_string(i);
    if (l.mla) return p + "'s attention is latent (MLA)";
    if (l.ffn != DecoderFfn::SwiGLU) return p + "'s feed-forward is not a SwiGLU";
    if (!l.rope.defined()) return p + " has no RoPE";
    for (const DecoderMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.output_proj, &l.w1, &l.w3, &l.w2}) {
      if (m->bias.defined()) return p + " has a bias";
    }
  }
  ops::DecodeStepWeights d;
  d.num_heads = num_heads;
  d.num_kv_heads = num_kv_heads;
  d.context_length = context_length;
  d.token_embeddings = token_embeddings;
  d.final_norm = final_norm;
  d.final_norm_eps = final_norm_eps;
  if (!head.quantized) return "the head is f32";
  d.head = head.quantized;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayerWeights& l = layers[i];
    for (const DecoderMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.output_proj, &l.w1, &l.w3, &l.w2}) {
      if (!m->quantized) return "layer " + std::to_string(i) + " has an f32 matrix";
    }
    ops::DecodeStepLayer k;
    k.q_proj = l.q_proj.quantized, k.k_proj = l.k_proj.quantized, k.v_proj = l.v_proj.quantized;
    k.output_proj = l.output_proj.quantized, k.w1 = l.w1.quantized, k.w3 = l.w3.quantized, k.w2 = l.w2.quantized;
    k.attn_norm = l.attn_norm, k.ffn_norm = l.ffn_norm;
    k.attn_norm_eps = l.attn_norm_eps, k.ffn_norm_eps = l.ffn_norm_eps;
    k.rope = l.rope;
    k.rope_style = l.rope_style;
    d.layers.push_back(std::move(k));
  }
  if (std::string why = ops::DecodeStep::unsupported(d); !why.empty()) return why;
  fused = std::make_shared<const ops::DecodeStep>(std::move(d));
  return "";
}

PagedKVCache::PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t kv_heads, int64_t block_size,
                           int64_t head_dim, bool values)
    : num_blocks_(num_blocks), block_size_(block_size), values_(values) {
  LOOM_CHECK(num_layers > 0 && num_blocks > 0 && kv_heads > 0 && block_size > 0 && head_dim > 0,
             "PagedKVCache: sizes must be positive: layers=", num_layers, " blocks=", num_blocks, " kv_heads=", kv_heads,
             " block_size=", block_size, " head_dim=", head_dim);
  for (int64_t l = 0; l < num_layers; ++l) {
    k.push_back(Tensor::zeros({num_blocks, kv_heads, block_size, head_dim}));
    v.push_back(values ? Tensor::zeros({num_blocks, kv_heads, block_size, head_dim}) : k.back());
  }
}

PagedKVCache::PagedKVCache(const DecoderWeights& w, int64_t num_blocks, int64_t block_size)
    : PagedKVCache(static_cast<int64_t>(w.layers.size()), num_blocks, w.num_kv_heads, block_size, w.cache_head_dim(),
                   w.cache_values()) {}

void PagedKVCache::copy_positions(int64_t from, int64_t to, int64_t count) {
  LOOM_CHECK(from >= 0 && from < num_blocks_ && to >= 0 && to < num_blocks_ && from != to,
             "PagedKVCache::copy_positions: blocks ", from, " -> ", to, " must be distinct and in [0, ", num_blocks_, ")");
  LOOM_CHECK(count >= 0 && count <= block_size_, "PagedKVCache::copy_positions: ", count, " positions of a block of ",
             block_size_);
  auto copy = [&](Tensor& t) {  // [NB, Hkv, S, D]
    const int64_t heads = t.size(1), d = t.size(3);
    float* base = t.data<float>();
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(base + ((to * heads + h) * block_size_) * d, base + ((from * heads + h) * block_size_) * d,
                  static_cast<size_t>(count * d) * sizeof(float));
    }
  };
  for (size_t l = 0; l < k.size(); ++l) {
    copy(k[l]);
    if (values_) copy(v[l]);  // a latent cache's v[l] is k[l]
  }
}

int64_t PagedKVCache::block_bytes(int64_t num_layers, int64_t kv_heads, int64_t block_size, int64_t head_dim,
                                  bool values) {
  return (values ? 2 : 1) * num_layers * kv_heads * block_size * head_dim * static_cast<int64_t>(sizeof(float));
}

int64_t PagedKVCache::block_bytes(const DecoderWeights& w, int64_t block_size) {
  return block_bytes(static_cast<int64_t>(w.layers.size()), w.num_kv_heads, block_size, w.cache_head_dim(),
                     w.cache_values());
}

namespace {

// Columns [first, first + n) of x [M, W], as a contiguous [M, n].
Tensor columns(const Tensor& x, int64_t first, int64_t n) {
  const int64_t M = x.size(0), W = x.size(1);
  Tensor out = Tensor::empty({M, n});
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(out.data<float>() + m * n, x.data<float>() + m * W + first, static_cast<size_t>(n) * sizeof(float));
  }
  return out;
}

// Multi-head latent attention of the rows h [R, C] (after the block's norm): writes each row's latent to
// its slot of `cache` [NB, 1, S, Rk+P] and returns the attention's output [R, C]. pos_q: i32 [R, H] and
// pos_1: [R, 1], each row's position per head.
Tensor latent_attention(const LatentAttentionWeights& m, int64_t H, const Tensor& h, Tensor& cache,
                        const ops::PagedRows& rows, const Tensor& pos_q, const Tensor& pos_1) {
  constexpr ops::RopeStyle kStyle = ops::RopeStyle::RotateHalf;  // models/deepseek_v3/mla.h: the seed's halves
  const int64_t R = h.size(0), Rk = m.kv_rank, N = m.d_nope, P = m.d_rope, W = Rk + P;
  // The latent [c | k_rope]: c normalised, k_rope rotated.
  const Tensor kv = m.wkv_a.apply(h);  // [R, Rk+P]
  const Tensor c = ops::rms_norm(columns(kv, 0, Rk), m.kv_norm, m.kv_norm_eps);
  const Tensor k_rope = ops::rope(columns(kv, Rk, P).view({R, 1, P}), pos_1, m.rope, kStyle);
  Tensor latent = Tensor::empty({R, 1, W});
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(latent.data<float>() + r * W, c.data<float>() + r * Rk, static_cast<size_t>(Rk) * sizeof(float));
    std::memcpy(latent.data<float>() + r * W + Rk, k_rope.data<float>() + r * P, static_cast<size_t>(P) * sizeof(float));
  }
  ops::paged_cache_write(cache, latent, rows);
  // The queries [q_abs | q_rope] per head: [R, H, Rk+P].
  const Tensor q = m.wq_b.apply(ops::rms_norm(m.wq_a.apply(h), m.q_norm, m.q_norm_eps)).view({R * H, N + P});
  const Tensor q_rope = ops::rope(columns(q, N, P).view({R, H, P}), pos_q, m.rope, kStyle);
  const Tensor q_nope = columns(q, 0, N).view({R, H, N});
  Tensor query = Tensor::empty({R, H, W});
  Tensor nope_h = Tensor::empty({R, N});
  for (int64_t hd = 0; hd < H; ++hd) {
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(nope_h.data<float>() + r * N, q_nope.data<float>() + (r * H + hd) * N, static_cast<size_t>(N) * sizeof(float));
    }
    const Tensor q_abs = m.w_uk[static_cast<size_t>(hd)].apply(nope_h);  // [R, Rk]
    for (int64_t r = 0; r < R; ++r) {
      float* out = query.data<float>() + (r * H + hd) * W;
      std::memcpy(out, q_abs.data<float>() + r * Rk, static_cast<size_t>(Rk) * sizeof(float));
      std::memcpy(out + Rk, q_rope.data<float>() + (r * H + hd) * P, static_cast<size_t>(P) * sizeof(float));
    }
  }
  // Attention over the latents: values are their c, the scale the per-head dims' (as the model's).
  ops::PagedAttentionOptions o;
  o.scale = m.scale;
  o.value_dim = Rk;
  const Tensor att = ops::paged_attention(query, cache, cache, rows, o);  // [R, H, Rk]
  return m.wo_abs.apply(att.view({R, H * Rk}));
}

// The experts of the rows h [R, C]: each row routed on its own (ops::moe_route), each expert run over
// the rows that chose it, and a row's K outputs summed in its own top-k order (so the other rows an
// expert serves change nothing), then the shared experts added.
Tensor moe_forward(const MoeWeights& m, const Tensor& h) {
  const int64_t R = h.size(0), C = h.size(1), K = m.top_k, E = static_cast<int64_t>(m.w1.size());
  const ops::MoeRouting routing = ops::moe_route(m.router.apply(h), m.bias, K, m.route_scale);
  const int32_t* index = routing.expert_index.data<int32_t>();  // [R, K]
  const float* gates = routing.gates.data<float>();            // [R, K]
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // per expert, slots r*K + k in row order
  for (int64_t s = 0; s < R * K; ++s) slots[static_cast<size_t>(index[s])].push_back(s);
  std::vector<float> out(static_cast<size_t>(R * K * C));  // each slot's expert output
  const size_t row_bytes = static_cast<size_t>(C) * sizeof(float);
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& mine = slots[static_cast<size_t>(e)];
    if (mine.empty()) continue;
    const int64_t n = static_cast<int64_t>(mine.size());
    Tensor xs = Tensor::empty({n, C});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xs.data<float>() + i * C, h.data<float>() + (mine[static_cast<size_t>(i)] / K) * C, row_bytes);
    }
    const size_t ei = static_cast<size_t>(e);
    const Tensor y = m.w2[ei].apply(ops::swiglu(m.w1[ei].apply(xs), m.w3[ei].apply(xs)));  // [n, C]
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out.data() + mine[static_cast<size_t>(i)] * C, y.data<float>() + i * C, row_bytes);
    }
  }
  Tensor y = Tensor::zeros({R, C});
  float* yd = y.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      const float g = gates[r * K + k];
      const float* o = out.data() + (r * K + k) * C;
      for (int64_t i = 0; i < C; ++i) yd[r * C + i] = yd[r * C + i] + g * o[i];
    }
  }
  if (m.shared_w1.defined()) y = ops::add(y, m.shared_w2.apply(ops::swiglu(m.shared_w1.apply(h), m.shared_w3.apply(h))));
  return y;
}

}  // namespace

Tensor paged_decoder_forward(const DecoderWeights& w, PagedKVCache& cache, const std::vector<DecoderBatchItem>& items) {
  autograd::NoGradGuard no_grad;
  const int64_t C = w.d_model(), H = w.num_heads, Hkv = w.num_kv_heads, D = w.head_dim(), V = w.vocab_size();
  // The step's rows, item after item.
  std::vector<int32_t> ids;
  ops::PagedRows rows;
  std::vector<int64_t> logit_rows;  // the row of each item's last token, for the items that want logits
  for (const DecoderBatchItem& item : items) {
    LOOM_CHECK(!item.tokens.empty(), "paged_decoder_forward: an item has no tokens");
    LOOM_CHECK(item.start >= 0 && item.start + static_cast<int64_t>(item.tokens.size()) <= w.context_length,
               "paged_decoder_forward: positions ", item.start, "..", item.start + static_cast<int64_t>(item.tokens.size()) - 1,
               " pass the context length ", w.context_length);
    for (size_t i = 0; i < item.tokens.size(); ++i) {
      ids.push_back(item.tokens[i]);
      rows.positions.push_back(item.start + static_cast<int64_t>(i));
      rows.tables.push_back(item.table);
    }
    if (item.logits) logit_rows.push_back(static_cast<int64_t>(ids.size()) - 1);
  }
  const int64_t R = static_cast<int64_t>(ids.size());
  if (R == 0) return Tensor::empty({0, V});
  if (w.fused) return ops::paged_decode_step(*w.fused, ids, rows, logit_rows, cache.k, cache.v);
  Tensor x = ops::embedding(Tensor::from_vector<int32_t>({R}, ids), w.token_embeddings);  // [R, C]
  if (w.position_embeddings.defined()) {  // learned positions: x + wpe[position], as GPT-2's embed
    std::vector<int32_t> at(rows.positions.begin(), rows.positions.end());
    x = ops::add(x, ops::embedding(Tensor::from_vector<int32_t>({R}, at), w.position_embeddings));
  }
  auto norm = [&](const Tensor& in, const Tensor& gain, const Tensor& bias, float eps) {
    return w.norm == DecoderNorm::Layer ? ops::layer_norm(in, gain, bias, eps) : ops::rms_norm(in, gain, eps);
  };
  // RoPE positions per (row, head): ops::rope rotates x [R, heads, D] by positions of its leading shape.
  auto positions_for = [&](int64_t heads) {
    std::vector<int32_t> p(static_cast<size_t>(R * heads));
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t h = 0; h < heads; ++h) p[static_cast<size_t>(r * heads + h)] = static_cast<int32_t>(rows.positions[static_cast<size_t>(r)]);
    }
    return Tensor::from_vector<int32_t>({R, heads}, p);
  };
  const Tensor pos_q = positions_for(H), pos_kv = positions_for(Hkv);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w.layers[l];
    Tensor h = norm(x, lw.attn_norm, lw.attn_norm_bias, lw.attn_norm_eps);
    if (lw.mla) {
      x = ops::add(x, latent_attention(*lw.mla, H, h, cache.k[l], rows, pos_q, pos_kv));
    } else {
      Tensor q = lw.q_proj.apply(h).view({R, H, D});
      Tensor k = lw.k_proj.apply(h).view({R, Hkv, D});
      if (lw.rope.defined()) {
        q = ops::rope(q, pos_q, lw.rope, lw.rope_style);
        k = ops::rope(k, pos_kv, lw.rope, lw.rope_style);
      }
      Tensor v = lw.v_proj.apply(h).view({R, Hkv, D});
      ops::paged_kv_write(cache.k[l], cache.v[l], k, v, rows);
      Tensor a = ops::paged_attention(q, cache.k[l], cache.v[l], rows).view({R, H * D});
      x = ops::add(x, lw.output_proj.apply(a));
    }
    h = norm(x, lw.ffn_norm, lw.ffn_norm_bias, lw.ffn_norm_eps);
    switch (lw.ffn) {
      case DecoderFfn::SwiGLU: x = ops::add(x, lw.w2.apply(ops::swiglu(lw.w1.apply(h), lw.w3.apply(h)))); break;
      case DecoderFfn::GeluTanh: x = ops::add(x, lw.w2.apply(ops::gelu(lw.w1.apply(h), ops::GeluApproximation::Tanh))); break;
      case DecoderFfn::MoE: x = ops::add(x, moe_forward(*lw.moe, h)); break;
    }
  }
  // The head over the rows that need logits only.
  const int64_t n = static_cast<int64_t>(logit_rows.size());
  Tensor last = Tensor::empty({n, C});
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(last.data<float>() + i * C, x.data<float>() + logit_rows[static_cast<size_t>(i)] * C,
                static_cast<size_t>(C) * sizeof(float));
  }
  if (n == 0) return Tensor::empty({0, V});
  return w.head.apply(norm(last, w.final_norm, w.final_norm_bias, w.final_norm_eps));
}

}  // namespace loom::nn
