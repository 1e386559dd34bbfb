#include "models/llama/gguf.h"

#include <cmath>
#include <set>

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

std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, models::GgufMatrices matrices,
                                                   std::vector<std::string>& notes) {
  const bool quantized = matrices != models::GgufMatrices::F32;
  const bool only = matrices == models::GgufMatrices::QuantizedOnly;
  // The GGUF tensor of a projection or the head (the embedding's when the head is tied), and whether it
  // is held quantized: stored in a type with kernels.
  auto stored_name = [&](const std::string& weight) {
    const std::string name = gguf_tensor_name(weight);
    if (weight == "lm_head.weight" && !file.header().find_tensor(name)) return gguf_tensor_name("token_embeddings.weight");
    return name;
  };
  auto held = [&](const std::string& weight) {
    const gguf::TensorInfo* t = file.header().find_tensor(stored_name(weight));
    return quantized && t != nullptr && quant::has_matmul_kernels(t->type);
  };
  auto matrices_of = [](TransformerLM& m) {
    std::vector<nn::Linear*> out = {&m.lm_head};
    for (const auto& b : m.layers) {
      for (nn::Linear* linear : {&b->attn.q_proj, &b->attn.k_proj, &b->attn.v_proj, &b->attn.output_proj, &b->ffn.w1,
                                 &b->ffn.w3, &b->ffn.w2}) {
        out.push_back(linear);
      }
    }
    return out;
  };
  // QuantizedOnly: the held matrices' f32 parameters are never filled (the loader skips their tensors),
  // so no f32 copy of them exists at any time, not even while loading.
  std::set<std::string> skip;
  if (only) {
    int64_t layers = -1;
    try {
      layers = config_from_gguf(file.header()).num_layers;
    } catch (const Error&) {  // gguf_build_model reports it, naming the file
    }
    std::vector<std::string> weights = {"lm_head.weight"};
    for (int64_t i = 0; i < layers; ++i) {
      for (const char* p : {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w3", "ffn.w2"}) {
        weights.push_back(str("layers.", i, ".", p, ".weight"));
      }
    }
    for (const std::string& w : weights) {
      if (held(w)) skip.insert(w);
    }
    // The token embedding too: a lookup reads a row from its blocks (nn::Embedding::quantized), so its
    // f32 table (SmolLM2's: 113 MiB) is never built either.
    if (held("token_embeddings.weight")) skip.insert("token_embeddings.weight");
  }
  auto model = models::gguf_build_model<TransformerLM>(file, config_from_gguf, tensor_names(), notes, skip);
  if (quantized) {
    const std::vector<nn::Linear*> linears = matrices_of(*model);
    size_t kept = 0;
    for (nn::Linear* linear : linears) {
      if (!held(linear->weight.name)) continue;
      const std::string name = stored_name(linear->weight.name);
      const gguf::TensorInfo& t = file.info(name);
      const Shape s = file.shape(name);
      // QuantizedOnly: the blocks are read in place from the file's mapping, the one copy there is.
      linear->set_quantized(only ? std::make_shared<quant::QuantizedMatrix>(t.type, s[0], s[1], file.owner(),
                                                                            file.bytes(name).data())
                                 : std::make_shared<quant::QuantizedMatrix>(t.type, s[0], s[1], file.bytes(name).data()));
      if (only) {
        LOOM_ASSERT(skip.count(linear->weight.name) == 1);
        linear->weight.value = Tensor::empty({0});  // never filled: the constructor's untouched buffer goes
        linear->weight.bf16_copy = Tensor();
        linear->weight.value_changed();
      }
      ++kept;
    }
    notes.push_back(str(kept, " of ", linears.size(), " matrices kept quantized ",
                        only ? "only, never in f32" : "for inference", " (the others in f32)"));
    if (skip.count("token_embeddings.weight")) {
      const std::string name = stored_name("token_embeddings.weight");
      const Shape s = file.shape(name);
      model->token_embeddings.quantized =
          std::make_shared<quant::QuantizedMatrix>(file.info(name).type, s[0], s[1], file.owner(), file.bytes(name).data());
      model->token_embeddings.weight.value = Tensor::empty({0});
      model->token_embeddings.weight.value_changed();
      notes.push_back("the token embedding kept quantized only: rows dequantized as they are looked up");
    }
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
