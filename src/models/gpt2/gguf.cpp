#include "models/gpt2/gguf.h"

#include <cmath>
#include <cstring>
#include <set>

#include "models/gpt2/model.h"

namespace loom::gpt2 {
namespace {

int64_t positive_key(const gguf::Header& h, const std::string& key) {
  const uint64_t v = h.get_uint(key);
  LOOM_CHECK(v >= 1 && v <= (uint64_t{1} << 40), "metadata ", gguf::quoted(key), " is ", v, ", expected a positive size");
  return static_cast<int64_t>(v);
}

// Stacks f32 tensors along dim 0 (q, k, v -> qkv): [R_i, ...] -> [sum R_i, ...].
Tensor stacked(const std::vector<Tensor>& parts) {
  std::vector<int64_t> dims(parts[0].shape().begin(), parts[0].shape().end());
  dims[0] = 0;
  for (const Tensor& p : parts) dims[0] += p.size(0);
  Tensor out = Tensor::empty(Shape(dims), DType::F32);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const Tensor& c = p;
    std::memcpy(out.data<float>() + at, c.data<float>(), static_cast<size_t>(c.numel()) * sizeof(float));
    at += c.numel();
  }
  return out;
}

Tensor bias_or_zeros(const nn::Linear& l) {
  return l.bias ? l.bias->value.detach() : Tensor::zeros({l.weight.value.size(0)});
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
  const int64_t C = cfg.d_model;
  std::set<std::string> loaded, used;
  auto load = [&](const std::string& loom_name, const Tensor& v) {
    const Shape want = model->parameter(loom_name).value.shape();
    LOOM_CHECK(v.shape() == want, file.path(), ": ", loom_name, " would get shape ", v.shape(), " from the file but the "
               "metadata implies ", want);
    model->load_parameter(loom_name, v);
    loaded.insert(loom_name);
  };
  auto get = [&](const std::string& gguf_name, const Shape& want) {
    LOOM_CHECK(file.header().find_tensor(gguf_name) != nullptr, file.path(), ": no tensor ", gguf::quoted(gguf_name));
    LOOM_CHECK(file.shape(gguf_name) == want, file.path(), ": tensor ", gguf::quoted(gguf_name), " has shape ",
               file.shape(gguf_name), " (ne reversed) but the metadata implies ", want);
    used.insert(gguf_name);
    return file.dequantized(gguf_name);
  };
  auto direct = [&](const std::string& g, const std::string& l) {
    load(l, get(g, model->parameter(l).value.shape()));
  };
  direct("token_embd.weight", "token_embeddings.weight");
  direct("position_embd.weight", "position_embeddings.weight");
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string b = str("blk.", i, "."), l = str("layers.", i, ".");
    for (const char* p : {"weight", "bias"}) {
      direct(b + "attn_norm." + p, l + "ln1." + p);
      direct(b + "ffn_norm." + p, l + "ln2." + p);
      direct(b + "attn_output." + p, l + "attn.output_proj." + p);
      direct(b + "ffn_up." + p, l + "mlp.fc." + p);
      direct(b + "ffn_down." + p, l + "mlp.proj." + p);
    }
    // attn_qkv [3C, C] / [3C]: rows q, then k, then v.
    const Tensor w = get(b + "attn_qkv.weight", Shape({3 * C, C}));
    const Tensor bias = get(b + "attn_qkv.bias", Shape({3 * C}));
    const char* names[] = {"q_proj", "k_proj", "v_proj"};
    for (int j = 0; j < 3; ++j) {
      load(l + "attn." + names[j] + ".weight", w.slice(j * C, C).clone());
      load(l + "attn." + names[j] + ".bias", bias.slice(j * C, C).clone());
    }
  }
  direct("output_norm.weight", "ln_final.weight");
  direct("output_norm.bias", "ln_final.bias");
  if (!cfg.tie_embeddings) direct("output.weight", "lm_head.weight");
  for (const gguf::TensorInfo& t : file.header().tensors) {
    LOOM_CHECK(used.count(t.name), file.path(), ": tensor ", gguf::quoted(t.name), " (", quant::quant_type_name(t.type),
               ") is not part of loom's GPT-2");
  }
  for (nn::Parameter* p : model->parameters()) LOOM_CHECK(loaded.count(p->name), file.path(), ": nothing loaded into ", p->name);
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
  // llama.cpp's order: embeddings, each block, the final norm, the head (only when untied).
  auto add = [&](const std::string& name, const Tensor& v) {
    tensors.push_back({name, v.detach(), v.shape().ndim() == 2});
  };
  add("token_embd.weight", gpt->token_embeddings.weight.value);
  add("position_embd.weight", gpt->position_embeddings.weight.value);
  for (size_t i = 0; i < gpt->layers.size(); ++i) {
    const Block& b = *gpt->layers[i];
    const std::string p = str("blk.", i, ".");
    add(p + "attn_norm.weight", b.ln1.weight.value);
    add(p + "attn_norm.bias", b.ln1.bias.value);
    add(p + "attn_qkv.weight", stacked({b.attn.q_proj.weight.value.detach(), b.attn.k_proj.weight.value.detach(),
                                        b.attn.v_proj.weight.value.detach()}));
    add(p + "attn_qkv.bias", stacked({bias_or_zeros(b.attn.q_proj), bias_or_zeros(b.attn.k_proj), bias_or_zeros(b.attn.v_proj)}));
    add(p + "attn_output.weight", b.attn.output_proj.weight.value);
    add(p + "attn_output.bias", bias_or_zeros(b.attn.output_proj));
    add(p + "ffn_norm.weight", b.ln2.weight.value);
    add(p + "ffn_norm.bias", b.ln2.bias.value);
    add(p + "ffn_up.weight", b.mlp.fc.weight.value);
    add(p + "ffn_up.bias", b.mlp.fc.bias->value);
    add(p + "ffn_down.weight", b.mlp.proj.weight.value);
    add(p + "ffn_down.bias", b.mlp.proj.bias->value);
  }
  add("output_norm.weight", gpt->ln_final.weight.value);
  add("output_norm.bias", gpt->ln_final.bias.value);
  if (gpt->lm_head) add("output.weight", gpt->lm_head->weight.value);
}

}  // namespace loom::gpt2
