#include "models/llama/hf.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/hf.h"

namespace loom::llama {
namespace fs = std::filesystem;
using nlohmann::json;
using models::hf_float;

namespace {

// Row permutation within each head of a [H*D, C] matrix: out row (h*D + to(j)) = in row (h*D + j).
Tensor permute_head_rows(const Tensor& w, int64_t num_heads, bool to_rotate_half) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2, "RoPE row permutation: expected an f32 [H*D, C] matrix, got ",
             dtype_name(w.dtype()), " ", w.shape());
  const int64_t rows = w.shape()[0], C = w.shape()[1];
  LOOM_CHECK(num_heads > 0 && rows % num_heads == 0 && (rows / num_heads) % 2 == 0, "RoPE row permutation: ", rows,
             " rows do not split into ", num_heads, " heads of even size");
  const int64_t D = rows / num_heads;
  Tensor out = Tensor::empty(w.shape(), DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) {
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t interleaved = h * D + 2 * i + half;      // loom: pair i is rows (2i, 2i+1)
        const int64_t rotate_half = h * D + half * (D / 2) + i;  // HF: pair i is rows (i, i + D/2)
        const int64_t from = to_rotate_half ? interleaved : rotate_half;
        const int64_t to = to_rotate_half ? rotate_half : interleaved;
        std::memcpy(dst + to * C, src + from * C, static_cast<size_t>(C) * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace

Config config_from_hf(const json& c, const std::string& path) {
  auto unsupported = [&](const std::string& what) {
    LOOM_FAIL(path, ": ", what, " is not supported by loom's Llama (", "supported: model_type llama, hidden_act silu, "
              "no biases, default RoPE without scaling, num_key_value_heads dividing num_attention_heads)");
  };
  const std::string model_type = c.value("model_type", "");
  if (model_type != "llama") unsupported(str("model_type \"", model_type, "\""));
  const std::string act = c.value("hidden_act", "silu");
  if (act != "silu" && act != "swish") unsupported(str("hidden_act \"", act, "\""));
  if (c.value("attention_bias", false)) unsupported("attention_bias = true");
  if (c.value("mlp_bias", false)) unsupported("mlp_bias = true");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) unsupported(str("rope_scaling ", io::brief_json(c["rope_scaling"])));
  // transformers 5 keeps RoPE's settings in rope_parameters: {"rope_type": "default", "rope_theta": ...}.
  std::optional<float> theta;
  if (c.contains("rope_parameters") && !c["rope_parameters"].is_null()) {
    const json& rp = c["rope_parameters"];
    if (!rp.is_object()) unsupported(str("rope_parameters ", io::brief_json(rp)));
    for (const auto& [key, value] : rp.items()) {
      if (key == "rope_theta") {
        if (!value.is_number()) unsupported(str("rope_parameters.rope_theta ", io::brief_json(value)));
        theta = value.get<float>();
      } else if (key == "rope_type") {
        if (!value.is_string() || value.get<std::string>() != "default") unsupported(str("rope_parameters.rope_type ", io::brief_json(value)));
      } else {
        unsupported(str("rope_parameters.", key, " = ", io::brief_json(value)));
      }
    }
  }
  if (c.contains("rope_theta") && !c["rope_theta"].is_null()) {
    if (!c["rope_theta"].is_number()) unsupported(str("rope_theta ", c["rope_theta"].dump()));
    const float top = c["rope_theta"].get<float>();
    LOOM_CHECK(!theta || *theta == top, path, ": rope_theta = ", top, " disagrees with rope_parameters.rope_theta = ",
               *theta);
    theta = top;
  }
  try {
    llama::Config m;
    m.vocab_size = c.at("vocab_size").get<int64_t>();
    m.d_model = c.at("hidden_size").get<int64_t>();
    m.d_ff = c.at("intermediate_size").get<int64_t>();
    m.num_layers = c.at("num_hidden_layers").get<int64_t>();
    m.num_heads = c.at("num_attention_heads").get<int64_t>();
    m.context_length = c.value("max_position_embeddings", int64_t{2048});
    m.rope_theta = theta.value_or(10000.0f);
    m.norm_eps = c.value("rms_norm_eps", 1e-6f);
    const int64_t kv = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                           ? c["num_key_value_heads"].get<int64_t>()
                           : m.num_heads;
    LOOM_CHECK(kv > 0 && m.num_heads % kv == 0, path, ": num_key_value_heads = ", kv,
               " does not divide num_attention_heads = ", m.num_heads);
    m.num_kv_heads = kv == m.num_heads ? 0 : kv;
    if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"].get<int64_t>() * m.num_heads != m.d_model) {
      unsupported(str("head_dim = ", c["head_dim"].get<int64_t>(), " with hidden_size ", m.d_model, " and ", m.num_heads,
                      " heads"));
    }
    m.validate();
    return m;
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed Llama config: ", e.what());
  }
}

Tensor interleaved_to_rotate_half(const Tensor& w, int64_t num_heads) { return permute_head_rows(w, num_heads, true); }
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t num_heads) { return permute_head_rows(w, num_heads, false); }

std::string hf_parameter_name(const std::string& n) {
  static const std::regex layer(R"(layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> within = {
      {"attn.q_proj.weight", "self_attn.q_proj.weight"},  {"attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"attn.v_proj.weight", "self_attn.v_proj.weight"},  {"attn.output_proj.weight", "self_attn.o_proj.weight"},
      {"ffn.w1.weight", "mlp.gate_proj.weight"},          {"ffn.w3.weight", "mlp.up_proj.weight"},
      {"ffn.w2.weight", "mlp.down_proj.weight"},          {"ln1.weight", "input_layernorm.weight"},
      {"ln2.weight", "post_attention_layernorm.weight"}};
  if (n == "token_embeddings.weight") return "model.embed_tokens.weight";
  if (n == "ln_final.weight") return "model.norm.weight";
  if (n == "lm_head.weight") return "lm_head.weight";
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    auto it = within.find(m[2].str());
    if (it != within.end()) return "model.layers." + m[1].str() + "." + it->second;
  }
  LOOM_FAIL("hf_parameter_name: no Hugging Face name for loom parameter '", n, "'");
}

std::optional<std::string> loom_parameter_name(const std::string& n) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> within = {
      {"self_attn.q_proj.weight", "attn.q_proj.weight"},  {"self_attn.k_proj.weight", "attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "attn.v_proj.weight"},  {"self_attn.o_proj.weight", "attn.output_proj.weight"},
      {"mlp.gate_proj.weight", "ffn.w1.weight"},          {"mlp.up_proj.weight", "ffn.w3.weight"},
      {"mlp.down_proj.weight", "ffn.w2.weight"},          {"input_layernorm.weight", "ln1.weight"},
      {"post_attention_layernorm.weight", "ln2.weight"}};
  if (n == "model.embed_tokens.weight") return "token_embeddings.weight";
  if (n == "model.norm.weight") return "ln_final.weight";
  if (n == "lm_head.weight") return "lm_head.weight";
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    auto it = within.find(m[2].str());
    if (it != within.end()) return "layers." + m[1].str() + "." + it->second;
  }
  return std::nullopt;
}

namespace {
bool is_qk(const std::string& loom_name) {
  return loom_name.ends_with("attn.q_proj.weight") || loom_name.ends_with("attn.k_proj.weight");
}
// Heads in the rows of a q or k projection: k has the k/v heads (fewer with grouped-query attention).
int64_t heads_in_rows(const std::string& loom_name, const Config& c) {
  return loom_name.ends_with("attn.k_proj.weight") ? c.kv_heads() : c.num_heads;
}
}  // namespace

void export_hf(const models::LanguageModel& base, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const auto* llama_model = dynamic_cast<const TransformerLM*>(&base);
  LOOM_CHECK(llama_model != nullptr, "llama::export_hf: the model is a ", base.arch(), ", not a llama");
  const TransformerLM& model = *llama_model;
  const Config& c = model.config();
  io::NamedTensors tensors;
  for (nn::Parameter* p : const_cast<TransformerLM&>(model).parameters()) {
    Tensor v = p->value.detach();
    if (is_qk(p->name)) v = interleaved_to_rotate_half(v, heads_in_rows(p->name, c));
    tensors.emplace_back(hf_parameter_name(p->name), v);
  }
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

  std::optional<int64_t> eot = models::hf_end_of_text(tok);
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", c.d_model},
                 {"intermediate_size", c.d_ff},
                 {"num_attention_heads", c.num_heads},
                 {"num_key_value_heads", c.kv_heads()},
                 {"num_hidden_layers", c.num_layers},
                 {"head_dim", c.head_dim()},
                 {"hidden_act", "silu"},
                 {"rms_norm_eps", hf_float(c.norm_eps)},
                 {"rope_theta", hf_float(c.rope_theta)},
                 {"rope_scaling", nullptr},
                 {"vocab_size", c.vocab_size},
                 {"max_position_embeddings", c.context_length},
                 {"tie_word_embeddings", false},
                 {"attention_bias", false},
                 {"attention_dropout", 0.0},
                 {"mlp_bias", false},
                 {"initializer_range", 0.02},
                 {"pretraining_tp", 1},
                 {"use_cache", true},
                 {"torch_dtype", "float32"}};
  json generation = {{"_from_model_config", true}, {"max_length", c.context_length}};
  if (eot) {
    config["bos_token_id"] = *eot;
    config["eos_token_id"] = *eot;
    generation["bos_token_id"] = *eot;
    generation["eos_token_id"] = *eot;
  }
  models::hf_write_json(fs::path(out_dir) / "config.json", config);
  models::hf_write_json(fs::path(out_dir) / "generation_config.json", generation);
  if (tok) models::hf_write_tokenizer(*tok, out_dir, c.context_length, /*gpt2_files=*/false);
}

models::HfImport import_hf(const std::string& dir, const json& hf_config) {
  const fs::path root(dir);
  const Config cfg = config_from_hf(hf_config, (root / "config.json").string());
  models::HfImport out;
  auto model = std::make_unique<TransformerLM>(cfg, 0);
  std::set<std::string> loaded;
  std::optional<Tensor> embed;
  models::hf_for_each_tensor(dir, [&](const io::SafetensorsFile& file, const std::string& hf) {
    if (hf.ends_with("rotary_emb.inv_freq")) return;  // a buffer older transformers saved, recomputed
    auto name = loom_parameter_name(hf);
    LOOM_CHECK(name.has_value(), file.path(), ": tensor '", hf,
               "' is not part of loom's Llama (biases and other extra weights are not supported)");
    Tensor v = models::hf_read_as_f32(file, hf);
    LOOM_CHECK(v.shape() == model->parameter(*name).value.shape(), file.path(), ": '", hf, "' has shape ", v.shape(),
               " but config.json implies ", model->parameter(*name).value.shape());
    if (is_qk(*name)) v = rotate_half_to_interleaved(v, heads_in_rows(*name, cfg));
    if (*name == "token_embeddings.weight") embed = v;
    model->load_parameter(*name, v);
    loaded.insert(*name);
  });
  if (!loaded.count("lm_head.weight") && embed) {
    // Tied embeddings (tie_word_embeddings, or a checkpoint that omits lm_head): loom's head is untied, so
    // it gets a copy, which computes the same logits.
    model->load_parameter("lm_head.weight", *embed);
    loaded.insert("lm_head.weight");
    out.notes.push_back("lm_head.weight is tied to model.embed_tokens.weight: copied into loom's untied lm_head");
  }
  for (nn::Parameter* p : model->parameters()) {
    LOOM_CHECK(loaded.count(p->name), "HF import: \"", dir, "\" has no tensor '", hf_parameter_name(p->name), "'");
  }
  out.model = std::move(model);
  models::hf_read_tokenizer(dir, out);
  return out;
}

}  // namespace loom::llama
