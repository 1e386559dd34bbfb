#include "models/llama/gguf.h"

#include <cmath>

#include "models/gguf.h"
#include "models/llama/names.h"
#include "quant/qmatmul.h"

namespace loom::llama {
using models::gguf_positive_key;

std::string gguf_tensor_name(const std::string& n) {
  return models::stored_name(tensor_names(), models::TensorFormat::Gguf, n);
}

Config config_from_gguf(const gguf::Header& h) {
  const std::string& arch = h.get_string("general.architecture");
  LOOM_CHECK(arch == "llama", "general.architecture is ", gguf::quoted(arch), ", not \"llama\"");
  auto unsupported = [](const std::string& what) {
    LOOM_FAIL(what, " is not supported by loom's Llama (supported: RoPE without scaling over the whole head, "
              "no experts, head dim = embedding_length / head_count)");
  };
  Config c;
  c.num_layers = gguf_positive_key(h, "llama.block_count");
  c.d_model = gguf_positive_key(h, "llama.embedding_length");
  c.d_ff = gguf_positive_key(h, "llama.feed_forward_length");
  c.num_heads = gguf_positive_key(h, "llama.attention.head_count");
  const int64_t kv =
      h.find("llama.attention.head_count_kv") ? gguf_positive_key(h, "llama.attention.head_count_kv") : c.num_heads;
  LOOM_CHECK(c.num_heads % kv == 0, "llama.attention.head_count_kv = ", kv, " does not divide llama.attention.head_count = ",
             c.num_heads);
  c.num_kv_heads = kv == c.num_heads ? 0 : kv;
  c.context_length = h.find("llama.context_length") ? gguf_positive_key(h, "llama.context_length") : 2048;
  if (h.find("llama.rope.freq_base")) c.rope_theta = static_cast<float>(h.get_number("llama.rope.freq_base"));
  c.norm_eps = static_cast<float>(h.get_number("llama.attention.layer_norm_rms_epsilon"));
  LOOM_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "llama.attention.layer_norm_rms_epsilon is ", c.norm_eps,
             ", expected a positive number");
  c.vocab_size = models::gguf_vocab_size(h, "llama");
  LOOM_CHECK(c.d_model % c.num_heads == 0, "llama.embedding_length = ", c.d_model,
             " is not divisible by llama.attention.head_count = ", c.num_heads);
  const int64_t head_dim = c.d_model / c.num_heads;
  for (const char* key : {"llama.attention.key_length", "llama.attention.value_length"}) {
    if (h.find(key) && static_cast<int64_t>(h.get_uint(key)) != head_dim) {
      unsupported(str(key, " = ", h.get_uint(key), " (embedding_length / head_count = ", head_dim, ")"));
    }
  }
  if (h.find("llama.rope.dimension_count") && static_cast<int64_t>(h.get_uint("llama.rope.dimension_count")) != head_dim) {
    unsupported(str("llama.rope.dimension_count = ", h.get_uint("llama.rope.dimension_count"), " (partial rotary; head dim ",
                    head_dim, ")"));
  }
  if (h.find("llama.rope.scaling.type")) {
    const std::string& t = h.get_string("llama.rope.scaling.type");
    if (t != "none") unsupported("llama.rope.scaling.type = " + gguf::quoted(t));
  }
  if (h.find("llama.rope.scaling.factor") && h.get_number("llama.rope.scaling.factor") != 1.0 &&
      h.get_number("llama.rope.scaling.factor") != 0.0) {
    unsupported(str("llama.rope.scaling.factor = ", h.get_number("llama.rope.scaling.factor")));
  }
  if (h.find("llama.expert_count") && h.get_uint("llama.expert_count") > 0) {
    unsupported(str("llama.expert_count = ", h.get_uint("llama.expert_count"), " (mixture of experts)"));
  }
  if (h.find_tensor("rope_freqs.weight")) unsupported("the tensor rope_freqs.weight (Llama 3.1 RoPE scaling)");
  c.validate();
  return c;
}

std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, bool quantized,
                                                   std::vector<std::string>& notes) {
  auto model = models::gguf_build_model<TransformerLM>(file, config_from_gguf, tensor_names(), notes);
  if (quantized) {
    std::vector<std::pair<nn::Linear*, std::string>> linears = {{&model->lm_head, gguf_tensor_name("lm_head.weight")}};
    if (!file.header().find_tensor(linears[0].second)) linears[0].second = gguf_tensor_name("token_embeddings.weight");
    for (const auto& b : model->layers) {
      for (nn::Linear* linear : {&b->attn.q_proj, &b->attn.k_proj, &b->attn.v_proj, &b->attn.output_proj, &b->ffn.w1,
                                 &b->ffn.w3, &b->ffn.w2}) {
        linears.emplace_back(linear, gguf_tensor_name(linear->weight.name));
      }
    }
    size_t kept = 0;
    for (auto& [linear, name] : linears) {
      const gguf::TensorInfo& t = file.info(name);
      if (!quant::has_matmul_kernels(t.type)) continue;
      const Shape s = file.shape(name);
      linear->set_quantized(std::make_shared<quant::QuantizedMatrix>(t.type, s[0], s[1], file.bytes(name).data()));
      ++kept;
    }
    notes.push_back(str(kept, " of ", linears.size(), " matrices kept quantized for inference (the others in f32)"));
  }
  return model;
}

void export_gguf(const models::LanguageModel& base, std::vector<gguf::KeyValue>& kv,
                 std::vector<models::GgufTensorOut>& tensors) {
  const auto* llama_model = dynamic_cast<const TransformerLM*>(&base);
  LOOM_CHECK(llama_model != nullptr, "llama::export_gguf: the model is a ", base.arch(), ", not a llama");
  const Config& c = llama_model->config();
  auto u32 = [](int64_t v) { return gguf::Value{static_cast<uint32_t>(v)}; };
  kv.push_back({"llama.block_count", u32(c.num_layers)});
  kv.push_back({"llama.context_length", u32(c.context_length)});
  kv.push_back({"llama.embedding_length", u32(c.d_model)});
  kv.push_back({"llama.feed_forward_length", u32(c.d_ff)});
  kv.push_back({"llama.attention.head_count", u32(c.num_heads)});
  kv.push_back({"llama.attention.head_count_kv", u32(c.kv_heads())});
  kv.push_back({"llama.rope.freq_base", gguf::Value{c.rope_theta}});
  kv.push_back({"llama.attention.layer_norm_rms_epsilon", gguf::Value{c.norm_eps}});
  kv.push_back({"llama.vocab_size", u32(c.vocab_size)});
  kv.push_back({"llama.rope.dimension_count", u32(c.head_dim())});
  models::gguf_tensors_of(base, tensor_names(), tensors);
}

}  // namespace loom::llama
