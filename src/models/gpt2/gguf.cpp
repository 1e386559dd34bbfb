#include "models/gpt2/gguf.h"

#include <cmath>

#include "models/gguf.h"
#include "models/gpt2/model.h"
#include "models/gpt2/names.h"

namespace loom::gpt2 {
using models::gguf_positive_key;

Config config_from_gguf(const gguf::Header& h) {
  const std::string& arch = h.get_string("general.architecture");
  LOOM_CHECK(arch == "gpt2", "general.architecture is ", gguf::quoted(arch), ", not \"gpt2\"");
  Config c;
  c.num_layers = gguf_positive_key(h, "gpt2.block_count");
  c.d_model = gguf_positive_key(h, "gpt2.embedding_length");
  c.num_heads = gguf_positive_key(h, "gpt2.attention.head_count");
  c.context_length = gguf_positive_key(h, "gpt2.context_length");
  const int64_t ff = gguf_positive_key(h, "gpt2.feed_forward_length");
  c.d_ff = ff == 4 * c.d_model ? 0 : ff;
  c.norm_eps = static_cast<float>(h.get_number("gpt2.attention.layer_norm_epsilon"));
  LOOM_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "gpt2.attention.layer_norm_epsilon is ", c.norm_eps,
             ", expected a positive number");
  if (h.find("gpt2.attention.head_count_kv")) {
    const uint64_t kv = h.get_uint("gpt2.attention.head_count_kv");
    LOOM_CHECK(static_cast<int64_t>(kv) == c.num_heads, "gpt2.attention.head_count_kv = ", kv,
               " is not supported by loom's GPT-2 (multi-head attention only: head_count = ", c.num_heads, ")");
  }
  c.vocab_size = models::gguf_vocab_size(h, "gpt2");
  c.qkv_bias = c.output_proj_bias = true;  // llama.cpp's gpt2 always has them
  c.tie_embeddings = h.find_tensor("output.weight") == nullptr;
  c.dropout = 0.0f;
  c.validate();
  return c;
}

std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, models::GgufMatrices matrices,
                                                   std::vector<std::string>& notes) {
  auto model = models::gguf_build_model<GPT2>(file, config_from_gguf, tensor_names(), notes);
  if (matrices != models::GgufMatrices::F32) notes.push_back("gpt2: every matrix dequantized to f32 (loom's GPT-2 has no quantized kernels path)");
  return model;
}

void export_gguf(const models::LanguageModel& base, std::vector<gguf::KeyValue>& kv,
                 std::vector<models::GgufTensorOut>& tensors) {
  const auto* gpt = dynamic_cast<const GPT2*>(&base);
  LOOM_CHECK(gpt != nullptr, "gpt2::export_gguf: the model is a ", base.arch(), ", not a gpt2");
  const Config& c = gpt->config();
  auto u32 = [](int64_t v) { return gguf::Value{static_cast<uint32_t>(v)}; };
  kv.push_back({"gpt2.block_count", u32(c.num_layers)});
  kv.push_back({"gpt2.context_length", u32(c.context_length)});
  kv.push_back({"gpt2.embedding_length", u32(c.d_model)});
  kv.push_back({"gpt2.feed_forward_length", u32(c.ffn_dim())});
  kv.push_back({"gpt2.attention.head_count", u32(c.num_heads)});
  kv.push_back({"gpt2.attention.layer_norm_epsilon", gguf::Value{c.norm_eps}});
  kv.push_back({"gpt2.vocab_size", u32(c.vocab_size)});
  models::gguf_tensors_of(base, tensor_names(), tensors);
}

}  // namespace loom::gpt2
