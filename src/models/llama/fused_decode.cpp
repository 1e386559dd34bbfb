#include "models/llama/fused_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/activation.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/norm.h"
#include "backends/cpu/rope.h"
#include "core/parallel.h"
#include "quant/qmatmul.h"

namespace loom::llama {

namespace {

std::vector<const nn::Linear*> block_linears(const nn::TransformerBlock& b) {
  return {&b.attn.q_proj, &b.attn.k_proj, &b.attn.v_proj, &b.attn.output_proj, &b.ffn.w1, &b.ffn.w2, &b.ffn.w3};
}

}  // namespace

std::string fused_decode_unsupported(const TransformerLM& m) {
  const Config& c = m.config();
  if (c.head_dim() % 8 != 0) return str("head dim ", c.head_dim(), " is not a multiple of 8");
  auto linear_problem = [](const nn::Linear& l) -> std::string {
    if (l.weight.dist) return l.weight.name + " is sharded over a mesh";
    if (!l.quantized || !quant::has_matmul_kernels(l.quantized->type())) return l.weight.name + " is not held quantized";
    if (l.bias != nullptr) return l.weight.name + " has a bias";
    return "";
  };
  for (const auto& layer : m.layers) {
    for (const nn::Linear* l : block_linears(*layer)) {
      if (std::string why = linear_problem(*l); !why.empty()) return why;
    }
    if (!layer->attn.rope) return layer->attn.q_proj.weight.name + ": the attention has no RoPE";
    for (const nn::Parameter* p : {&layer->ln1.weight, &layer->ln2.weight}) {
      if (p->dist || p->value.dtype() != DType::F32) return p->name + " is not a plain f32 tensor";
    }
  }
  if (std::string why = linear_problem(m.lm_head); !why.empty()) return why;
  for (const nn::Parameter* p : {&m.token_embeddings.weight, &m.ln_final.weight}) {
    if (p->dist || p->value.dtype() != DType::F32) return p->name + " is not a plain f32 tensor";
  }
  return "";
}

Tensor fused_decode_step(const TransformerLM& m, int32_t token, nn::KVCache& cache) {
  const Config& c = m.config();
  const int64_t C = c.d_model, H = c.num_heads, Hkv = c.kv_heads(), D = c.head_dim(), F = c.d_ff, V = c.vocab_size;
  const int64_t P = cache.length(), L = static_cast<int64_t>(m.layers.size());
  LOOM_CHECK(token >= 0 && token < V, "TransformerLM: token id ", token, " is outside the vocabulary [0, ", V, ")");
  LOOM_CHECK(P + 1 <= c.context_length && P + 1 <= cache.capacity(), "TransformerLM: ", P,
             " cached + 1 new token exceed context_length ", c.context_length);
  const nn::LayerKV& kv0 = cache.layer(0);
  LOOM_CHECK(kv0.k.ndim() == 4 && kv0.k.size(0) == 1 && kv0.k.size(1) == Hkv && kv0.k.size(3) == D,
             "TransformerLM: the cache ", kv0.k.describe(), " is not a batch-1 cache of this model");
  quant::best_kernel_path();  // resolved (LOOM_QUANT_KERNEL checked) before the region, which cannot throw

  const int threads = num_threads();
  const int64_t cap = kv0.k.size(2), group = H / Hkv, half = D / 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));  // scaled_dot_product_attention's default
  // Shared between the team: x [C] the residual stream; q [H*D]; kbuf [Hkv*D]; y [C] the attention's
  // output; o [C] a projection's output; g, u, h [F].
  std::vector<float> shared(static_cast<size_t>(C + H * D + Hkv * D + C + C + 3 * F));
  float* x = shared.data();
  float* q = x + C;
  float* kbuf = q + H * D;
  float* y = kbuf + Hkv * D;
  float* o = y + C;
  float* g = o + C;
  float* u = g + F;
  float* h = u + F;
  // Per thread: the normed row [C], its quantized blocks [max(C, F) / 32].
  const int64_t act_blocks = std::max(C, F) / 32;
  std::vector<float> xn(static_cast<size_t>(threads * C));
  std::vector<quant::ActBlock> act(static_cast<size_t>(threads * act_blocks));
  Tensor logits = Tensor::empty({1, 1, V});
  std::memcpy(x, m.token_embeddings.weight.value.data<float>() + token * C, static_cast<size_t>(C) * sizeof(float));

  parallel_team(threads, [&](Team& team) {
    const int r = team.rank();
    float* my_xn = xn.data() + r * C;
    quant::ActBlock* my_act = act.data() + r * act_blocks;
    // out[n] for n in [n0, n1): row n of the layer's weight times this thread's quantized activations.
    auto rows = [&](const nn::Linear& l, int64_t n0, int64_t n1, float* out) {
      quant::quantized_matmul_rows(my_act, 1, *l.quantized, n0, n1, out, 0);
    };
    // Before a barrier: the first bytes of this thread's next share start loading during the wait.
    constexpr int64_t kPrefetchBytes = 4096;
    auto prefetch = [&](const nn::Linear& l, int64_t n0, int64_t n1) {
      quant::prefetch_matmul_rows(*l.quantized, n0, n1, kPrefetchBytes);
    };
    auto norm_and_quantize = [&](const nn::RMSNorm& norm, const float* in) {
      cpu::rms_norm_forward(my_xn, nullptr, in, norm.weight.value.data<float>(), 1, C, norm.eps);
      quant::quantize_activation_rows(my_xn, 1, C, my_act);
    };
    const auto [h0, h1] = team.share(H + 2 * Hkv);  // q, k, v heads
    const auto [a0, a1] = team.share(H);            // attention: query heads
    const auto [c0, c1] = team.share(C, 16);        // output_proj, w2 rows
    const auto [f0, f1] = team.share(F, 16);        // w1, w3 rows
    const auto [v0, v1] = team.share(V, 16);        // head rows
    // The q/k/v rows of heads [h0, h1) of layer b, by matrix.
    auto prefetch_qkv = [&](const nn::TransformerBlock& b) {
      prefetch(b.attn.q_proj, std::min(h0, H) * D, std::min(h1, H) * D);
      prefetch(b.attn.k_proj, std::clamp(h0 - H, int64_t{0}, Hkv) * D, std::clamp(h1 - H, int64_t{0}, Hkv) * D);
      prefetch(b.attn.v_proj, std::clamp(h0 - H - Hkv, int64_t{0}, Hkv) * D, std::clamp(h1 - H - Hkv, int64_t{0}, Hkv) * D);
    };
    for (int64_t li = 0; li < L; ++li) {
      const nn::TransformerBlock& b = *m.layers[static_cast<size_t>(li)];
      const nn::RotaryPositionalEmbedding& rope = *b.attn.rope;
      const float* cos = rope.cache.cos.data<float>() + P * half;
      const float* sin = rope.cache.sin.data<float>() + P * half;
      const bool interleaved = rope.style == ops::RopeStyle::Interleaved;
      nn::LayerKV& kv = cache.layer(li);
      float* kc = kv.k.data<float>();  // [Hkv, cap, D]
      float* vc = kv.v.data<float>();

      // 1. q/k/v: heads [0, H) of q_proj, then Hkv of k_proj, then Hkv of v_proj.
      if (li == 0) prefetch_qkv(b);
      norm_and_quantize(b.ln1, x);
      for (int64_t hd = h0; hd < h1; ++hd) {
        if (hd < H) {
          float* qh = q + hd * D;
          rows(b.attn.q_proj, hd * D, (hd + 1) * D, q);
          cpu::rope_rotate_row(qh, qh, cos, sin, D, interleaved, /*inverse=*/false);
        } else if (hd < H + Hkv) {
          const int64_t j = hd - H;
          rows(b.attn.k_proj, j * D, (j + 1) * D, kbuf);
          cpu::rope_rotate_row(kc + (j * cap + P) * D, kbuf + j * D, cos, sin, D, interleaved, false);
        } else {
          const int64_t j = hd - H - Hkv;
          rows(b.attn.v_proj, j * D, (j + 1) * D, vc + j * cap * D + P * D - j * D);
        }
      }
      team.barrier();
      // 2. attention of each query head over the cache's rows [0, P] (output_proj's rows load meanwhile).
      prefetch(b.attn.output_proj, c0, c1);
      // The flash kernel the op-by-op path runs, on one query row, with the cache's rows read in place
      // (no copy of the cache per step): bit for bit that path's attention (the 8-bit quantization of
      // the activations after it turns any other summation order into visibly different logits).
      for (int64_t hd = a0; hd < a1; ++hd) {
        const int64_t j = hd / group;
        AttentionProblem ap;
        ap.tq = 1;
        ap.tk = P + 1;
        ap.d = ap.dv = D;
        ap.scale = scale;
        ap.causal = true;
        ap.q = ap.out = {D, 0, D};
        ap.k = ap.v = {cap * D, 0, D};
        float lse;
        cpu::flash_attention_forward(ap, q + hd * D, kc + j * cap * D, vc + j * cap * D, y + hd * D, &lse);
      }
      team.barrier();
      // 3. x += output_proj(y).
      quant::quantize_activation_rows(y, 1, C, my_act);
      rows(b.attn.output_proj, c0, c1, o);
      for (int64_t n = c0; n < c1; ++n) x[n] = x[n] + o[n];
      prefetch(b.ffn.w1, f0, f1);
      prefetch(b.ffn.w3, f0, f1);
      team.barrier();
      // 4. h = swiglu(w1 x_n, w3 x_n).
      norm_and_quantize(b.ln2, x);
      rows(b.ffn.w1, f0, f1, g);
      rows(b.ffn.w3, f0, f1, u);
      cpu::swiglu_forward(h + f0, g + f0, u + f0, f1 - f0);
      prefetch(b.ffn.w2, c0, c1);
      team.barrier();
      // 5. x += w2 h.
      quant::quantize_activation_rows(h, 1, F, my_act);
      rows(b.ffn.w2, c0, c1, o);
      for (int64_t n = c0; n < c1; ++n) x[n] = x[n] + o[n];
      if (li + 1 < L) {
        prefetch_qkv(*m.layers[static_cast<size_t>(li + 1)]);
      } else {
        prefetch(m.lm_head, v0, v1);
      }
      team.barrier();
    }
    norm_and_quantize(m.ln_final, x);
    rows(m.lm_head, v0, v1, logits.data<float>());
  });
  return logits;
}

}  // namespace loom::llama
