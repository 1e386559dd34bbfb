#include "nn/paged_decoder.h"

#include <cstring>

#include "core/autograd.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/row_linear.h"
#include "quant/linear.h"

namespace loom::nn {

Tensor DecoderMatrix::apply(const Tensor& x) const {
  if (quantized) return quant::quantized_linear(x, *quantized, Tensor(), "decoder matrix");
  return ops::row_linear(x, f32);
}

namespace {

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
}

void check_vector(const Tensor& t, int64_t n, const std::string& name) {
  LOOM_CHECK(t.defined() && t.dtype() == DType::F32 && t.device().is_cpu() && t.shape() == Shape({n}),
             "decoder weights: ", name, " must be f32 [", n, "] on the CPU, got ", t.defined() ? t.describe() : "nothing");
}

}  // namespace

void DecoderWeights::check() const {
  LOOM_CHECK(token_embeddings.defined() && token_embeddings.dtype() == DType::F32 && token_embeddings.ndim() == 2 &&
                 token_embeddings.device().is_cpu(),
             "decoder weights: token_embeddings must be f32 [V, C] on the CPU");
  const int64_t C = d_model(), V = vocab_size();
  LOOM_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && C % num_heads == 0,
             "decoder weights: ", num_heads, " heads and ", num_kv_heads, " k/v heads do not fit d_model ", C);
  LOOM_CHECK(context_length > 0 && !layers.empty(), "decoder weights: no layers or no context");
  const int64_t D = head_dim(), Hkv = num_kv_heads;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayerWeights& l = layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    check_matrix(l.q_proj, num_heads * D, C, p + "q_proj");
    check_matrix(l.k_proj, Hkv * D, C, p + "k_proj");
    check_matrix(l.v_proj, Hkv * D, C, p + "v_proj");
    check_matrix(l.output_proj, C, num_heads * D, p + "output_proj");
    const int64_t F = l.w1.rows();
    check_matrix(l.w1, F, C, p + "w1");
    check_matrix(l.w3, F, C, p + "w3");
    check_matrix(l.w2, C, F, p + "w2");
    check_vector(l.attn_norm, C, p + "attn_norm");
    check_vector(l.ffn_norm, C, p + "ffn_norm");
    LOOM_CHECK(l.rope.defined() && l.rope.head_dim == D && l.rope.max_len() >= context_length, "decoder weights: ", p,
               "rope must cover ", context_length, " positions of head dim ", D);
  }
  check_vector(final_norm, C, "final_norm");
  check_matrix(head, V, C, "head");
}

std::string DecoderWeights::fuse() {
  fused.reset();
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
                           int64_t head_dim)
    : num_blocks_(num_blocks), block_size_(block_size) {
  LOOM_CHECK(num_layers > 0 && num_blocks > 0 && kv_heads > 0 && block_size > 0 && head_dim > 0,
             "PagedKVCache: sizes must be positive: layers=", num_layers, " blocks=", num_blocks, " kv_heads=", kv_heads,
             " block_size=", block_size, " head_dim=", head_dim);
  for (int64_t l = 0; l < num_layers; ++l) {
    k.push_back(Tensor::zeros({num_blocks, kv_heads, block_size, head_dim}));
    v.push_back(Tensor::zeros({num_blocks, kv_heads, block_size, head_dim}));
  }
}

int64_t PagedKVCache::block_bytes(int64_t num_layers, int64_t kv_heads, int64_t block_size, int64_t head_dim) {
  return 2 * num_layers * kv_heads * block_size * head_dim * static_cast<int64_t>(sizeof(float));
}

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
    Tensor h = ops::rms_norm(x, lw.attn_norm, lw.attn_norm_eps);
    Tensor q = ops::rope(lw.q_proj.apply(h).view({R, H, D}), pos_q, lw.rope, lw.rope_style);
    Tensor k = ops::rope(lw.k_proj.apply(h).view({R, Hkv, D}), pos_kv, lw.rope, lw.rope_style);
    Tensor v = lw.v_proj.apply(h).view({R, Hkv, D});
    ops::paged_kv_write(cache.k[l], cache.v[l], k, v, rows);
    Tensor a = ops::paged_attention(q, cache.k[l], cache.v[l], rows).view({R, H * D});
    x = ops::add(x, lw.output_proj.apply(a));
    h = ops::rms_norm(x, lw.ffn_norm, lw.ffn_norm_eps);
    x = ops::add(x, lw.w2.apply(ops::swiglu(lw.w1.apply(h), lw.w3.apply(h))));
  }
  // The head over the rows that need logits only.
  const int64_t n = static_cast<int64_t>(logit_rows.size());
  Tensor last = Tensor::empty({n, C});
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(last.data<float>() + i * C, x.data<float>() + logit_rows[static_cast<size_t>(i)] * C,
                static_cast<size_t>(C) * sizeof(float));
  }
  if (n == 0) return Tensor::empty({0, V});
  return w.head.apply(ops::rms_norm(last, w.final_norm, w.final_norm_eps));
}

}  // namespace loom::nn
