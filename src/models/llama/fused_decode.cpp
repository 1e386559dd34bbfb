#include "models/llama/fused_decode.h"

#include "models/llama/model.h"

namespace loom::llama {

namespace {

std::vector<const nn::Linear*> block_linears(const nn::TransformerBlock& b) {
  return {&b.attn.q_proj, &b.attn.k_proj, &b.attn.v_proj, &b.attn.output_proj, &b.ffn.w1, &b.ffn.w2, &b.ffn.w3};
}

// Why the model's layers cannot be described to the fused step, naming the parameter; "" when they can.
std::string unsupported_layers(const TransformerLM& m) {
  auto linear_problem = [](const nn::Linear& l) -> std::string {
    if (l.weight.dist) return l.weight.name + " is sharded over a mesh";
    if (l.lora) return l.weight.name + " has a LoRA adapter";
    if (!l.quantized || !quant::has_matmul_kernels(l.quantized->type())) return l.weight.name + " is not held quantized";
    if (l.bias != nullptr) return l.weight.name + " has a bias";
    return "";
  };
  auto plain = [](const nn::Parameter& p) -> std::string {
    const Tensor& v = p.value;
    if (p.dist || v.dtype() != DType::F32 || !v.device().is_cpu()) return p.name + " is not a plain f32 CPU tensor";
    return "";
  };
  for (const auto& layer : m.layers) {
    for (const nn::Linear* l : block_linears(*layer)) {
      if (std::string why = linear_problem(*l); !why.empty()) return why;
    }
    if (!layer->attn.rope) return layer->attn.q_proj.weight.name + ": the attention has no RoPE";
    for (const nn::Parameter* p : {&layer->ln1.weight, &layer->ln2.weight}) {
      if (std::string why = plain(*p); !why.empty()) return why;
    }
  }
  if (std::string why = linear_problem(m.lm_head); !why.empty()) return why;
  if (m.token_embeddings.quantized) return m.token_embeddings.weight.name + " is held quantized";
  for (const nn::Parameter* p : {&m.token_embeddings.weight, &m.ln_final.weight}) {
    if (std::string why = plain(*p); !why.empty()) return why;
  }
  return "";
}

}  // namespace

FusedDecodePlan plan_fused_decode(const TransformerLM& m) {
  if (std::string why = unsupported_layers(m); !why.empty()) return {nullptr, why};
  const Config& c = m.config();
  ops::DecodeStepWeights w;
  w.num_heads = c.num_heads;
  w.num_kv_heads = c.kv_heads();
  w.context_length = c.context_length;
  w.token_embeddings = m.token_embeddings.weight.value;
  for (const auto& layer : m.layers) {
    const nn::TransformerBlock& b = *layer;
    ops::DecodeStepLayer l;
    l.q_proj = b.attn.q_proj.quantized;
    l.k_proj = b.attn.k_proj.quantized;
    l.v_proj = b.attn.v_proj.quantized;
    l.output_proj = b.attn.output_proj.quantized;
    l.w1 = b.ffn.w1.quantized;
    l.w3 = b.ffn.w3.quantized;
    l.w2 = b.ffn.w2.quantized;
    l.attn_norm = b.ln1.weight.value;
    l.attn_norm_eps = b.ln1.eps;
    l.ffn_norm = b.ln2.weight.value;
    l.ffn_norm_eps = b.ln2.eps;
    l.rope = b.attn.rope->cache;
    l.rope_style = b.attn.rope->style;
    w.layers.push_back(std::move(l));
  }
  w.final_norm = m.ln_final.weight.value;
  w.final_norm_eps = m.ln_final.eps;
  w.head = m.lm_head.quantized;
  if (std::string why = ops::DecodeStep::unsupported(w); !why.empty()) return {nullptr, why};
  return {std::make_shared<const ops::DecodeStep>(std::move(w)), ""};
}

std::optional<nn::DecoderWeights> decoder_weights_of(const TransformerLM& m, std::string* why) {
  auto refuse = [&](std::string reason) -> std::optional<nn::DecoderWeights> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  auto plain = [](const nn::Parameter& p) -> std::string {
    const Tensor& v = p.value;
    if (p.dist || v.dtype() != DType::F32 || !v.device().is_cpu()) return p.name + " is not a plain f32 CPU tensor";
    return "";
  };
  auto matrix = [&](const nn::Linear& l, nn::DecoderMatrix& out) -> std::string {
    if (l.bias != nullptr) return l.weight.name + " has a bias";
    if (l.lora) return l.weight.name + " has a LoRA adapter (merge it into the base first: loom merge)";
    if (l.quantized) {
      if (!quant::has_matmul_kernels(l.quantized->type())) return l.weight.name + " is held in a type without kernels";
      out.quantized = l.quantized;
      return "";
    }
    if (std::string p = plain(l.weight); !p.empty()) return p;
    out.f32 = l.weight.value;
    return "";
  };
  const Config& c = m.config();
  nn::DecoderWeights w;
  w.num_heads = c.num_heads;
  w.num_kv_heads = c.kv_heads();
  w.context_length = c.context_length;
  if (m.token_embeddings.quantized) return refuse(m.token_embeddings.weight.name + " is held quantized");
  for (const nn::Parameter* p : {&m.token_embeddings.weight, &m.ln_final.weight}) {
    if (std::string r = plain(*p); !r.empty()) return refuse(r);
  }
  w.token_embeddings = m.token_embeddings.weight.value;
  w.final_norm = m.ln_final.weight.value;
  w.final_norm_eps = m.ln_final.eps;
  if (std::string r = matrix(m.lm_head, w.head); !r.empty()) return refuse(r);
  for (const auto& layer : m.layers) {
    const nn::TransformerBlock& b = *layer;
    nn::DecoderLayerWeights l;
    const std::pair<const nn::Linear*, nn::DecoderMatrix*> linears[] = {
        {&b.attn.q_proj, &l.q_proj}, {&b.attn.k_proj, &l.k_proj}, {&b.attn.v_proj, &l.v_proj},
        {&b.attn.output_proj, &l.output_proj}, {&b.ffn.w1, &l.w1}, {&b.ffn.w3, &l.w3}, {&b.ffn.w2, &l.w2}};
    for (const auto& [linear, out] : linears) {
      if (std::string r = matrix(*linear, *out); !r.empty()) return refuse(r);
    }
    if (!b.attn.rope) return refuse(b.attn.q_proj.weight.name + ": the attention has no RoPE");
    for (const nn::Parameter* p : {&b.ln1.weight, &b.ln2.weight}) {
      if (std::string r = plain(*p); !r.empty()) return refuse(r);
    }
    l.attn_norm = b.ln1.weight.value;
    l.attn_norm_eps = b.ln1.eps;
    l.ffn_norm = b.ln2.weight.value;
    l.ffn_norm_eps = b.ln2.eps;
    l.rope = b.attn.rope->cache;
    l.rope_style = b.attn.rope->style;
    w.layers.push_back(std::move(l));
  }
  w.check();
  w.fuse();  // the one-region step when every matrix is quantized; op by op (the same bits) otherwise
  return w;
}

}  // namespace loom::llama
