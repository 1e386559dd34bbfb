#include "models/gpt2/gguf.h"

#include <cmath>

#include "models/gguf.h"
#include "models/gpt2/model.h"
#include "models/gpt2/names.h"

namespace loom::gpt2 {
namespace {

int64_t positive_key(const gguf::Header& h, const std::string& key) {
  const uint64_t v = h.get_uint(key);
  LOOM_CHECK(v >= 1 && v <= (uint64_t{1} << 40), "metadata ", gguf::quoted(key), " is ", v, ", expected a positive size");
  return static_cast<int64_t>(v);
}

}  // namespace

Config config_from_gguf(const gguf::Header& h) {
  const std::string& arch = h.get_string("general.architecture");
  LOOM_CHECK(arch == "gpt2", "general.architecture is ", gguf::quoted(arch), ", not \"gpt2\"");
  Config c;
  c.num_layers = positive_key(h, "gpt2.block_count");
  c.d_model = positive_key(h, "gpt2.embedding_length");
  c.num_heads = positive_key(h, "gpt2.attention.head_count");
  c.context_length = positive_key(h, "gpt2.context_length");
  const int64_t ff = positive_key(h, "gpt2.feed_forward_length");
  c.d_ff = ff == 4 * c.d_model ? 0 : ff;
  c.norm_eps = static_cast<float>(h.get_number("gpt2.attention.layer_norm_epsilon"));
  LOOM_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "gpt2.attention.layer_norm_epsilon is ", c.norm_eps,
             ", expected a positive number");
  if (h.find("gpt2.attention.head_count_kv")) {
    const uint64_t kv = h.get_uint("gpt2.attention.head_count_kv");
    LOOM_CHECK(static_cast<int64_t>(kv) == c.num_heads, "gpt2.attention.head_count_kv = ", kv,
               " is not supported by loom's GPT-2 (multi-head attention only: head_count = ", c.num_heads, ")");
  }
  if (h.find("gpt2.vocab_size")) {
    c.vocab_size = positive_key(h, "gpt2.vocab_size");
  } else {
    const gguf::TensorInfo* e = h.find_tensor("token_embd.weight");
    LOOM_CHECK(e != nullptr && e->ne.size() == 2, "no gpt2.vocab_size and no 2-D token_embd.weight to take it from");
    c.vocab_size = static_cast<int64_t>(e->ne[1]);
  }
  c.qkv_bias = c.output_proj_bias = true;  // llama.cpp's gpt2 always has them
  c.tie_embeddings = h.find_tensor("output.weight") == nullptr;
  c.dropout = 0.0f;
  c.validate();
  return c;
}

std::unique_ptr<models::LanguageModel> import_gguf(const gguf::GgufFile& file, bool quantized,
                                                   std::vector<std::string>& notes) {
  Config cfg;
  try {
    cfg = config_from_gguf(file.header());
  } catch (const Error& e) {
    LOOM_FAIL(file.path(), ": ", e.what());
  }
  std::unique_ptr<GPT2> model;
  {
    nn::SkipInitGuard no_init;  // every parameter is loaded below, or the import fails
    model = std::make_unique<GPT2>(cfg, 0);
  }
  models::gguf_load_tensors(*model, tensor_names(), file, notes);
  if (quantized) notes.push_back("gpt2: every matrix dequantized to f32 (loom's GPT-2 has no quantized kernels path)");
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
