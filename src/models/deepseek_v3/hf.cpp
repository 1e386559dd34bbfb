#include "models/deepseek_v3/hf.h"

#include <filesystem>
#include <optional>

#include "io/json.h"
#include "models/deepseek_v3/names.h"
#include "models/hf.h"

namespace loom::deepseek_v3 {
namespace fs = std::filesystem;
using nlohmann::json;
using models::hf_float;

namespace {
Config read_config(const json& c, const std::string& path) {
  auto unsupported = [&](const std::string& what) {
    LOOM_FAIL(path, ": ", what, " is not supported by loom's DeepSeek-V3 (supported: model_type deepseek_v3, hidden_act "
              "silu, q_lora_rank set, no attention bias, no rope scaling, moe_layer_freq 1, scoring_func sigmoid, "
              "topk_method noaux_tc, norm_topk_prob true, topk_group = n_group)");
  };
  auto is_set = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  const std::string model_type = c.value("model_type", "");
  if (model_type != "deepseek_v3") unsupported(str("model_type \"", model_type, "\""));
  const std::string act = c.value("hidden_act", "silu");
  if (act != "silu" && act != "swish") unsupported(str("hidden_act \"", act, "\""));
  if (c.value("attention_bias", false)) unsupported("attention_bias = true");
  if (is_set("rope_scaling")) unsupported(str("rope_scaling ", io::brief_json(c["rope_scaling"])));
  if (!is_set("q_lora_rank")) unsupported("q_lora_rank = null (a full-rank q_proj)");
  if (is_set("scoring_func") && c["scoring_func"] != "sigmoid") unsupported(str("scoring_func ", c["scoring_func"].dump()));
  if (is_set("topk_method") && c["topk_method"] != "noaux_tc") unsupported(str("topk_method ", c["topk_method"].dump()));
  if (is_set("norm_topk_prob") && !c["norm_topk_prob"].get<bool>()) {
    unsupported("norm_topk_prob = false (loom always normalises the selected gates)");
  }
  if (is_set("moe_layer_freq") && c["moe_layer_freq"].get<int64_t>() != 1) {
    unsupported(str("moe_layer_freq = ", c["moe_layer_freq"].dump()));
  }
  const int64_t n_group = is_set("n_group") ? c["n_group"].get<int64_t>() : 1;
  const int64_t topk_group = is_set("topk_group") ? c["topk_group"].get<int64_t>() : n_group;
  if (topk_group < n_group) {
    unsupported(str("group-limited routing (n_group = ", n_group, ", topk_group = ", topk_group, ")"));
  }
  // transformers 5 keeps RoPE's settings in rope_parameters: {"rope_type": "default", "rope_theta": ...}.
  std::optional<float> theta;
  if (is_set("rope_parameters")) {
    const json& rp = c["rope_parameters"];
    if (!rp.is_object()) unsupported(str("rope_parameters ", io::brief_json(rp)));
    for (const auto& [key, value] : rp.items()) {
      if (key == "rope_theta" && value.is_number()) {
        theta = value.get<float>();
      } else if (key == "rope_type" && value.is_string() && value.get<std::string>() == "default") {
      } else {
        unsupported(str("rope_parameters.", key, " = ", io::brief_json(value)));
      }
    }
  }
  try {
    if (is_set("rope_theta")) {
      const float top = c["rope_theta"].get<float>();
      LOOM_CHECK(!theta || *theta == top, path, ": rope_theta = ", top, " disagrees with rope_parameters.rope_theta = ",
                 *theta);
      theta = top;
    }
    Config m;
    m.vocab_size = c.at("vocab_size").get<int64_t>();
    m.d_model = c.at("hidden_size").get<int64_t>();
    m.num_layers = c.at("num_hidden_layers").get<int64_t>();
    m.num_heads = c.at("num_attention_heads").get<int64_t>();
    m.context_length = c.value("max_position_embeddings", int64_t{4096});
    m.q_rank = c.at("q_lora_rank").get<int64_t>();
    m.kv_rank = c.at("kv_lora_rank").get<int64_t>();
    m.d_nope = c.at("qk_nope_head_dim").get<int64_t>();
    m.d_rope = c.at("qk_rope_head_dim").get<int64_t>();
    m.d_v = c.at("v_head_dim").get<int64_t>();
    m.d_ff = c.at("intermediate_size").get<int64_t>();
    m.d_expert = c.at("moe_intermediate_size").get<int64_t>();
    m.n_shared = is_set("n_shared_experts") ? c["n_shared_experts"].get<int64_t>() : 0;
    if (!is_set("n_routed_experts")) unsupported("n_routed_experts = null (no routed experts)");
    m.n_routed = c["n_routed_experts"].get<int64_t>();
    m.top_k = c.at("num_experts_per_tok").get<int64_t>();
    m.n_dense = c.value("first_k_dense_replace", int64_t{0});
    m.route_scale = c.value("routed_scaling_factor", 1.0f);
    m.n_mtp = c.value("num_nextn_predict_layers", int64_t{0});
    m.rope_theta = theta.value_or(10000.0f);
    m.norm_eps = c.value("rms_norm_eps", 1e-6f);
    m.init_std = c.value("initializer_range", 0.02f);
    // Training settings HF has no key for, as loom's export writes them.
    if (is_set("loom")) {
      const json& l = c["loom"];
      m.gamma = l.value("gamma", m.gamma);
      m.alpha_seq = l.value("alpha_seq", m.alpha_seq);
      m.mtp_lambda = l.value("mtp_lambda", m.mtp_lambda);
    }
    if (n_group > 1 && m.n_routed % n_group != 0) {
      unsupported(str("n_group = ", n_group, " not dividing n_routed_experts = ", m.n_routed));
    }
    m.validate();
    return m;
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed DeepSeek-V3 config: ", e.what());
  }
}
}  // namespace

Config config_from_hf(const json& c, const std::string& path) {
  // A key of the wrong JSON type (norm_topk_prob "yes", n_group 1.5) is a malformed config, named.
  try {
    return read_config(c, path);
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed DeepSeek-V3 config: ", e.what());
  }
}

void export_hf(const models::LanguageModel& base, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const auto* m = dynamic_cast<const DeepSeekV3*>(&base);
  LOOM_CHECK(m != nullptr, "deepseek_v3::export_hf: the model is a ", base.arch(), ", not a deepseek_v3");
  const Config& c = m->config();
  models::hf_write_tensors(base, tensor_names(), out_dir);
  json config = {{"architectures", {"DeepseekV3ForCausalLM"}},
                 {"model_type", "deepseek_v3"},
                 {"vocab_size", c.vocab_size},
                 {"hidden_size", c.d_model},
                 {"intermediate_size", c.d_ff},
                 {"moe_intermediate_size", c.d_expert},
                 {"num_hidden_layers", c.num_layers},
                 {"num_attention_heads", c.num_heads},
                 {"num_key_value_heads", c.num_heads},
                 {"q_lora_rank", c.q_rank},
                 {"kv_lora_rank", c.kv_rank},
                 {"qk_nope_head_dim", c.d_nope},
                 {"qk_rope_head_dim", c.d_rope},
                 {"v_head_dim", c.d_v},
                 {"head_dim", c.d_rope},
                 {"n_shared_experts", c.n_shared},
                 {"n_routed_experts", c.n_routed},
                 {"num_experts_per_tok", c.top_k},
                 {"first_k_dense_replace", c.n_dense},
                 {"moe_layer_freq", 1},
                 {"routed_scaling_factor", hf_float(c.route_scale)},
                 {"norm_topk_prob", true},
                 {"n_group", 1},
                 {"topk_group", 1},
                 {"scoring_func", "sigmoid"},
                 {"topk_method", "noaux_tc"},
                 {"seq_aux", true},
                 {"aux_loss_alpha", hf_float(c.alpha_seq)},
                 {"num_nextn_predict_layers", c.n_mtp},
                 {"hidden_act", "silu"},
                 {"max_position_embeddings", c.context_length},
                 {"initializer_range", hf_float(c.init_std)},
                 {"rms_norm_eps", hf_float(c.norm_eps)},
                 {"rope_theta", hf_float(c.rope_theta)},
                 {"rope_scaling", nullptr},
                 {"rope_interleave", true},
                 {"attention_bias", false},
                 {"attention_dropout", 0.0},
                 {"tie_word_embeddings", false},
                 {"use_cache", true},
                 {"torch_dtype", "float32"},
                 {"loom", {{"gamma", hf_float(c.gamma)}, {"alpha_seq", hf_float(c.alpha_seq)},
                           {"mtp_lambda", hf_float(c.mtp_lambda)}}}};
  models::hf_write_configs(out_dir, config, {{"_from_model_config", true}, {"max_length", c.context_length}}, tok,
                           c.context_length, /*gpt2_files=*/false);
}

models::HfImport import_hf(const std::string& dir, const json& hf_config) {
  const fs::path root(dir);
  const std::string config_path = (root / "config.json").string();
  Config cfg = config_from_hf(hf_config, config_path);
  bool interleave = true;  // transformers' default
  if (hf_config.contains("rope_interleave") && !hf_config["rope_interleave"].is_null()) {
    LOOM_CHECK(hf_config["rope_interleave"].is_boolean(), config_path, ": rope_interleave must be true or false, got ",
               hf_config["rope_interleave"].dump());
    interleave = hf_config["rope_interleave"].get<bool>();
  }
  std::vector<std::string> notes;
  if (cfg.norm_eps != 1e-6f) {
    notes.push_back(str("rms_norm_eps = ", cfg.norm_eps, ": transformers' q_a_layernorm and kv_a_layernorm use 1e-6 "
                        "whatever it says, loom's MLA norms use it too, so logits differ slightly"));
  }

  // The MTP layers are optional: transformers' save_pretrained does not write them (its model has no
  // such module), DeepSeek's checkpoints do. Without them the import has n_mtp = 0. DeepSeek's own V3
  // checkpoint has an MoE block in its MTP layer, which loom's (the seed's dense one) cannot hold: such
  // layers are left out too, with a note, since they take no part in the logits.
  models::TensorImportOptions options;
  if (cfg.n_mtp > 0) {
    bool any = false, moe = false;
    for (const std::string& n : models::hf_tensor_names(dir)) {
      for (int64_t k = 0; k < cfg.n_mtp; ++k) {
        const std::string p = "model.layers." + std::to_string(cfg.num_layers + k) + ".";
        if (n.rfind(p, 0) != 0) continue;
        any = true;
        moe = moe || n.rfind(p + "mlp.gate.", 0) == 0 || n.rfind(p + "mlp.experts.", 0) == 0;
      }
    }
    if (!any) {
      notes.push_back(str("num_nextn_predict_layers = ", cfg.n_mtp, " but no tensor 'model.layers.", cfg.num_layers,
                          ".*': imported without MTP modules (n_mtp = 0; they are used in training only)"));
    } else if (moe) {
      notes.push_back(str("the MTP layers (model.layers.", cfg.num_layers, " on) have MoE blocks, loom's MTP block is "
                          "dense: imported without MTP modules (n_mtp = 0; they are used in training only)"));
      for (int64_t k = 0; k < cfg.n_mtp; ++k) options.ignored.push_back(str("model.layers.", cfg.num_layers + k, ".*"));
    }
    if (!any || moe) cfg.n_mtp = 0;
  }
  options.rope_rows_as_stored = !interleave;
  options.unknown_hint = str(" for ", config_path, " (num_hidden_layers ", cfg.num_layers, ", first_k_dense_replace ",
                             cfg.n_dense, ", n_routed_experts ", cfg.n_routed, ", ", cfg.n_mtp,
                             " MTP layers with a dense block)");
  return models::hf_import_model(std::make_unique<DeepSeekV3>(cfg, 0), tensor_names(), dir, options, std::move(notes));
}

}  // namespace loom::deepseek_v3
