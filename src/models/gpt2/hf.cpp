#include "models/gpt2/hf.h"

#include <filesystem>

#include "models/gpt2/model.h"
#include "models/gpt2/names.h"
#include "models/hf.h"

namespace loom::gpt2 {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Config config_from_hf(const json& c, const std::string& path) {
  auto unsupported = [&](const std::string& what) {
    LOOM_FAIL(path, ": ", what, " is not supported by loom's GPT-2 (supported: model_type gpt2, activation "
              "gelu_new or gelu_pytorch_tanh, scaled attention, no cross-attention)");
  };
  auto flag = [&](const char* key, bool fallback) {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    if (!c[key].is_boolean()) unsupported(str(key, " = ", c[key].dump()));
    return c[key].get<bool>();
  };
  const std::string act = c.value("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") unsupported(str("activation_function \"", act, "\""));
  if (!flag("scale_attn_weights", true)) unsupported("scale_attn_weights = false");
  if (flag("scale_attn_by_inverse_layer_idx", false)) unsupported("scale_attn_by_inverse_layer_idx = true");
  if (flag("add_cross_attention", false)) unsupported("add_cross_attention = true");
  try {
    Config m;
    m.vocab_size = c.at("vocab_size").get<int64_t>();
    m.context_length = c.at("n_positions").get<int64_t>();
    m.d_model = c.at("n_embd").get<int64_t>();
    m.num_layers = c.at("n_layer").get<int64_t>();
    m.num_heads = c.at("n_head").get<int64_t>();
    m.d_ff = c.contains("n_inner") && !c["n_inner"].is_null() ? c["n_inner"].get<int64_t>() : 0;
    if (m.d_ff == 4 * m.d_model) m.d_ff = 0;
    m.norm_eps = c.value("layer_norm_epsilon", 1e-5f);
    m.qkv_bias = true;  // HF's c_attn and c_proj always have biases
    m.output_proj_bias = true;
    m.tie_embeddings = flag("tie_word_embeddings", true);
    m.dropout = 0.0f;  // imported weights are for inference or fine-tuning: set model.dropout to train with it
    m.validate();
    return m;
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed GPT-2 config: ", e.what());
  } catch (const Error& e) {
    LOOM_FAIL(path, ": ", e.what());
  }
}

}  // namespace

void export_hf(const models::LanguageModel& base, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const auto* gpt = dynamic_cast<const GPT2*>(&base);
  LOOM_CHECK(gpt != nullptr, "gpt2::export_hf: the model is a ", base.arch(), ", not a gpt2");
  const Config& c = gpt->config();
  models::hf_write_tensors(base, tensor_names(), out_dir);
  const double p = static_cast<double>(c.dropout);
  json config = {{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", c.vocab_size},
                 {"n_positions", c.context_length},
                 {"n_ctx", c.context_length},
                 {"n_embd", c.d_model},
                 {"n_layer", c.num_layers},
                 {"n_head", c.num_heads},
                 {"n_inner", c.d_ff == 0 ? json(nullptr) : json(c.d_ff)},
                 {"activation_function", "gelu_new"},
                 {"layer_norm_epsilon", models::hf_float(c.norm_eps)},
                 {"resid_pdrop", p},
                 {"embd_pdrop", p},
                 {"attn_pdrop", p},
                 {"initializer_range", 0.02},
                 {"scale_attn_weights", true},
                 {"scale_attn_by_inverse_layer_idx", false},
                 {"reorder_and_upcast_attn", false},
                 {"tie_word_embeddings", c.tie_embeddings},
                 {"use_cache", true},
                 {"torch_dtype", "float32"}};
  models::hf_write_configs(out_dir, config, {{"_from_model_config", true}}, tok, c.context_length, /*gpt2_files=*/true);
}

models::HfImport import_hf(const std::string& dir, const json& hf_config) {
  const Config cfg = config_from_hf(hf_config, (fs::path(dir) / "config.json").string());
  // An untied model needs its head; a tied one may carry it too, equal to wte (the table's tie).
  LOOM_CHECK(cfg.tie_embeddings || models::hf_tensor_names(dir).count("lm_head.weight"), "HF import: \"", dir,
             "\" has tie_word_embeddings = false but no lm_head.weight");
  return models::hf_import_model(std::make_unique<GPT2>(cfg, 0), tensor_names(), dir,
                                 {.unknown_hint = str(" (loom reads GPT2LMHeadModel's and OpenAI's names; n_layer = ",
                                                      cfg.num_layers, ")")});
}

}  // namespace loom::gpt2
