#include "models/llama/hf.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/json.h"
#include "models/hf.h"
#include "models/llama/names.h"

namespace loom::llama {
namespace fs = std::filesystem;
using nlohmann::json;
using models::hf_float;

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

namespace {
models::RopeRows heads_of(const Tensor& w, int64_t num_heads) {
  LOOM_CHECK(num_heads > 0 && w.shape().ndim() == 2 && w.shape()[0] % num_heads == 0, "RoPE row permutation: ",
             w.shape(), " does not split into ", num_heads, " heads");
  return {num_heads, 0, w.shape()[0] / num_heads};
}
}  // namespace

Tensor interleaved_to_rotate_half(const Tensor& w, int64_t num_heads) {
  return models::reorder_rope_rows(w, heads_of(w, num_heads), /*to_interleaved=*/false);
}
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t num_heads) {
  return models::reorder_rope_rows(w, heads_of(w, num_heads), /*to_interleaved=*/true);
}

std::string hf_parameter_name(const std::string& n) {
  return models::stored_name(tensor_names(), models::TensorFormat::Hf, n);
}

std::optional<std::string> loom_parameter_name(const std::string& n) {
  return models::loom_name(tensor_names(), models::TensorFormat::Hf, n);
}

void export_hf(const models::LanguageModel& base, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const auto* llama_model = dynamic_cast<const TransformerLM*>(&base);
  LOOM_CHECK(llama_model != nullptr, "llama::export_hf: the model is a ", base.arch(), ", not a llama");
  const Config& c = llama_model->config();
  models::hf_write_tensors(base, tensor_names(), out_dir);
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
  models::hf_write_configs(out_dir, config, {{"_from_model_config", true}, {"max_length", c.context_length}}, tok,
                           c.context_length, /*gpt2_files=*/false);
}

models::HfImport import_hf(const std::string& dir, const json& hf_config) {
  const Config cfg = config_from_hf(hf_config, (fs::path(dir) / "config.json").string());
  return models::hf_import_model(std::make_unique<TransformerLM>(cfg, 0), tensor_names(), dir,
                                 {.unknown_hint = " (biases and other extra weights are not supported)"});
}

}  // namespace loom::llama
