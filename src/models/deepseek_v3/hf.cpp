#include "models/deepseek_v3/hf.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/hf.h"

namespace loom::deepseek_v3 {
namespace fs = std::filesystem;
using nlohmann::json;
using models::hf_float;

namespace {

// How one HF tensor relates to loom's tensors.
enum class Kind {
  Plain,      // the same values
  RopeQ,      // wq_b: each head's rope rows reordered
  RopeKV,     // wkv_a: the last d_rope rows reordered
  SwapHalves, // MTP eh_proj: the two C-column halves of [C, 2C] swapped
  Expert,     // slice `expert` of a loom [E, ., .] parameter
  Copy,       // a duplicate DeepSeek's MTP layer carries (shared_head.*, embed_tokens)
};

struct Entry {
  std::string hf;
  std::string loom;  // the parameter (or state tensor) it comes from
  Kind kind = Kind::Plain;
  int64_t expert = 0;
  bool state = false;
};

// Names within a block (loom suffix -> HF suffix); the experts are listed separately.
const std::map<std::string, std::string>& block_names() {
  static const std::map<std::string, std::string> m = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attn.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attn.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attn.wo.weight", "self_attn.o_proj.weight"},
      {"mlp.w1.weight", "mlp.gate_proj.weight"},
      {"mlp.w3.weight", "mlp.up_proj.weight"},
      {"mlp.w2.weight", "mlp.down_proj.weight"},
      {"moe.router.weight", "mlp.gate.weight"},
      {"moe.bias", "mlp.gate.e_score_correction_bias"},
      {"moe.shared.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared.w2.weight", "mlp.shared_experts.down_proj.weight"},
  };
  return m;
}

const std::map<std::string, std::string>& expert_names() {
  static const std::map<std::string, std::string> m = {
      {"moe.experts.w1", "gate_proj.weight"}, {"moe.experts.w3", "up_proj.weight"}, {"moe.experts.w2", "down_proj.weight"}};
  return m;
}

// Every HF tensor of `model`'s export, in loom's parameter order (state and copies after their sources).
std::vector<Entry> entries(const DeepSeekV3& model) {
  const Config& c = model.config();
  std::vector<Entry> out;
  auto add_block_entry = [&](const std::string& loom, const std::string& loom_prefix, const std::string& hf_prefix,
                             bool state) {
    const std::string suffix = loom.substr(loom_prefix.size());
    if (auto it = block_names().find(suffix); it != block_names().end()) {
      Kind kind = suffix == "attn.wq_b.weight" ? Kind::RopeQ : suffix == "attn.wkv_a.weight" ? Kind::RopeKV : Kind::Plain;
      out.push_back({hf_prefix + it->second, loom, kind, 0, state});
      return;
    }
    if (auto it = expert_names().find(suffix); it != expert_names().end()) {
      for (int64_t e = 0; e < c.n_routed; ++e) {
        out.push_back({hf_prefix + "mlp.experts." + std::to_string(e) + "." + it->second, loom, Kind::Expert, e, false});
      }
      return;
    }
    LOOM_FAIL("deepseek_v3 HF export: no Hugging Face name for '", loom, "'");
  };
  auto add = [&](const std::string& loom, bool state) {
    if (loom == "token_embeddings.weight") return out.push_back({"model.embed_tokens.weight", loom, Kind::Plain, 0, state});
    if (loom == "ln_final.weight") return out.push_back({"model.norm.weight", loom, Kind::Plain, 0, state});
    if (loom == "lm_head.weight") return out.push_back({"lm_head.weight", loom, Kind::Plain, 0, state});
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      if (loom.rfind(p, 0) == 0) return add_block_entry(loom, p, "model." + p, state);
    }
    for (int64_t k = 0; k < c.n_mtp; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      const std::string hf = "model.layers." + std::to_string(c.num_layers + k) + ".";
      if (loom.rfind(p, 0) != 0) continue;
      if (loom == p + "norm_e.weight") return out.push_back({hf + "enorm.weight", loom, Kind::Plain, 0, state});
      if (loom == p + "norm_h.weight") return out.push_back({hf + "hnorm.weight", loom, Kind::Plain, 0, state});
      if (loom == p + "proj.weight") return out.push_back({hf + "eh_proj.weight", loom, Kind::SwapHalves, 0, state});
      if (loom.rfind(p + "block.", 0) == 0) return add_block_entry(loom, p + "block.", hf, state);
    }
    LOOM_FAIL("deepseek_v3 HF export: no Hugging Face name for '", loom, "'");
  };
  for (nn::Parameter* p : const_cast<DeepSeekV3&>(model).parameters()) add(p->name, false);
  for (const auto& [name, t] : model.state_tensors()) add(name, true);
  for (int64_t k = 0; k < c.n_mtp; ++k) {
    const std::string hf = "model.layers." + std::to_string(c.num_layers + k) + ".";
    out.push_back({hf + "embed_tokens.weight", "token_embeddings.weight", Kind::Copy, 0, false});
    out.push_back({hf + "shared_head.norm.weight", "ln_final.weight", Kind::Copy, 0, false});
    out.push_back({hf + "shared_head.head.weight", "lm_head.weight", Kind::Copy, 0, false});
  }
  return out;
}

// Rows of w [rows, C]: in each of `heads` segments of (nope + rope) rows, the last `rope` rows are moved
// between rotate-half order (pair i = rows i, i + rope/2) and interleaved order (pair i = rows 2i, 2i+1).
Tensor reorder_rope_rows(const Tensor& w, int64_t heads, int64_t nope, int64_t rope, bool to_interleaved) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2 && w.shape()[0] == heads * (nope + rope) && rope % 2 == 0,
             "deepseek_v3 RoPE row reordering: expected f32 [", heads * (nope + rope), ", C], got ", dtype_name(w.dtype()),
             " ", w.shape());
  const int64_t C = w.shape()[1];
  Tensor out = w.clone();
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * (nope + rope) + nope;
    for (int64_t i = 0; i < rope / 2; ++i) {
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t rotate_half = base + half * (rope / 2) + i, interleaved = base + 2 * i + half;
        const int64_t from = to_interleaved ? rotate_half : interleaved, to = to_interleaved ? interleaved : rotate_half;
        std::memcpy(dst + to * C, src + from * C, static_cast<size_t>(C) * sizeof(float));
      }
    }
  }
  return out;
}

// [C, 2C] with its column halves swapped (its own inverse).
Tensor swap_column_halves(const Tensor& w) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2 && w.shape()[1] % 2 == 0,
             "deepseek_v3 eh_proj: expected f32 [C, 2C], got ", w.shape());
  const int64_t R = w.shape()[0], C = w.shape()[1] / 2;
  Tensor out = Tensor::empty(w.shape(), DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(dst + r * 2 * C, src + r * 2 * C + C, static_cast<size_t>(C) * sizeof(float));
    std::memcpy(dst + r * 2 * C + C, src + r * 2 * C, static_cast<size_t>(C) * sizeof(float));
  }
  return out;
}

const DeepSeekV3& dsv3_of(const models::LanguageModel& base) {
  const auto* m = dynamic_cast<const DeepSeekV3*>(&base);
  LOOM_CHECK(m != nullptr, "deepseek_v3::export_hf: the model is a ", base.arch(), ", not a deepseek_v3");
  return *m;
}

Tensor loom_value(const DeepSeekV3& model, const std::string& name, bool state) {
  if (state) {
    for (const auto& [n, t] : model.state_tensors()) {
      if (n == name) return t;
    }
    LOOM_FAIL("deepseek_v3 HF: no state tensor '", name, "'");
  }
  return const_cast<DeepSeekV3&>(model).parameter(name).value.detach();
}

}  // namespace

Tensor rope_rows_to_interleaved(const Tensor& w, int64_t heads, int64_t nope, int64_t rope) {
  return reorder_rope_rows(w, heads, nope, rope, true);
}
Tensor rope_rows_from_interleaved(const Tensor& w, int64_t heads, int64_t nope, int64_t rope) {
  return reorder_rope_rows(w, heads, nope, rope, false);
}

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
  const DeepSeekV3& model = dsv3_of(base);
  const Config& c = model.config();
  io::NamedTensors tensors;
  for (const Entry& e : entries(model)) {
    Tensor v = loom_value(model, e.loom, e.state);
    switch (e.kind) {
      case Kind::Plain:
      case Kind::Copy: break;
      case Kind::RopeQ: v = rope_rows_to_interleaved(v, c.num_heads, c.d_nope, c.d_rope); break;
      case Kind::RopeKV: v = rope_rows_to_interleaved(v, 1, c.kv_rank, c.d_rope); break;
      case Kind::SwapHalves: v = swap_column_halves(v); break;
      case Kind::Expert: v = v.slice(e.expert, 1).clone().view(Shape({v.shape()[1], v.shape()[2]})); break;
    }
    tensors.emplace_back(e.hf, v);
  }
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

  std::optional<int64_t> eot = models::hf_end_of_text(tok);
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
  const std::string config_path = (root / "config.json").string();
  Config cfg = config_from_hf(hf_config, config_path);
  bool interleave = true;  // transformers' default
  if (hf_config.contains("rope_interleave") && !hf_config["rope_interleave"].is_null()) {
    LOOM_CHECK(hf_config["rope_interleave"].is_boolean(), config_path, ": rope_interleave must be true or false, got ",
               hf_config["rope_interleave"].dump());
    interleave = hf_config["rope_interleave"].get<bool>();
  }
  models::HfImport out;
  if (cfg.norm_eps != 1e-6f) {
    out.notes.push_back(str("rms_norm_eps = ", cfg.norm_eps, ": transformers' q_a_layernorm and kv_a_layernorm use 1e-6 "
                            "whatever it says, loom's MLA norms use it too, so logits differ slightly"));
  }

  // The MTP layers are optional: transformers' save_pretrained does not write them (its model has no
  // such module), DeepSeek's checkpoints do. Without them the import has n_mtp = 0. DeepSeek's own V3
  // checkpoint has an MoE block in its MTP layer, which loom's (the seed's dense one) cannot hold: such
  // layers are left out too, with a note, since they take no part in the logits.
  std::set<std::string> names;
  models::hf_for_each_tensor(dir, [&](const io::SafetensorsFile&, const std::string& hf) { names.insert(hf); });
  bool skip_mtp_layers = false;
  if (cfg.n_mtp > 0) {
    const std::string first = "model.layers." + std::to_string(cfg.num_layers) + ".";
    bool any = false, moe = false;
    for (const std::string& n : names) {
      for (int64_t k = 0; k < cfg.n_mtp; ++k) {
        const std::string p = "model.layers." + std::to_string(cfg.num_layers + k) + ".";
        if (n.rfind(p, 0) != 0) continue;
        any = true;
        moe = moe || n.rfind(p + "mlp.gate.", 0) == 0 || n.rfind(p + "mlp.experts.", 0) == 0;
      }
    }
    if (!any) {
      out.notes.push_back(str("num_nextn_predict_layers = ", cfg.n_mtp, " but no tensor '", first,
                              "*': imported without MTP modules (n_mtp = 0; they are used in training only)"));
      cfg.n_mtp = 0;
    } else if (moe) {
      out.notes.push_back(str("the MTP layers (model.layers.", cfg.num_layers, " on) have MoE blocks, loom's MTP "
                              "block is dense: imported without MTP modules (n_mtp = 0; they are used in training "
                              "only)"));
      skip_mtp_layers = true;
    }
  }
  const int64_t mtp_layers = skip_mtp_layers ? cfg.n_mtp : 0;
  if (skip_mtp_layers) cfg.n_mtp = 0;
  auto model = std::make_unique<DeepSeekV3>(cfg, 0);
  std::map<std::string, Entry> by_hf;
  for (Entry& e : entries(*model)) by_hf.emplace(e.hf, e);
  std::map<std::string, Tensor> experts;  // loom name -> the [E, ., .] being assembled
  std::set<std::string> loaded;
  std::vector<std::pair<Entry, Tensor>> copies;
  models::hf_for_each_tensor(dir, [&](const io::SafetensorsFile& file, const std::string& hf) {
    if (hf.ends_with("rotary_emb.inv_freq")) return;  // a buffer some versions save, recomputed
    for (int64_t k = 0; k < mtp_layers; ++k) {
      if (hf.rfind("model.layers." + std::to_string(cfg.num_layers + k) + ".", 0) == 0) return;
    }
    auto it = by_hf.find(hf);
    LOOM_CHECK(it != by_hf.end(), file.path(), ": tensor '", hf, "' is not part of loom's DeepSeek-V3 for ", config_path,
               " (num_hidden_layers ", cfg.num_layers, ", first_k_dense_replace ", cfg.n_dense, ", n_routed_experts ",
               cfg.n_routed, ", ", cfg.n_mtp, " MTP layers with a dense block)");
    const Entry& e = it->second;
    Tensor v = models::hf_read_as_f32(file, hf);
    Tensor target = loom_value(*model, e.loom, e.state);
    Shape want = target.shape();
    if (e.kind == Kind::Expert) want = Shape({target.shape()[1], target.shape()[2]});
    LOOM_CHECK(v.shape() == want, file.path(), ": '", hf, "' has shape ", v.shape(), " but config.json implies ", want);
    loaded.insert(hf);
    switch (e.kind) {
      case Kind::Plain: break;
      case Kind::Copy: copies.emplace_back(e, v); return;
      case Kind::RopeQ:
        if (interleave) v = rope_rows_from_interleaved(v, cfg.num_heads, cfg.d_nope, cfg.d_rope);
        break;
      case Kind::RopeKV:
        if (interleave) v = rope_rows_from_interleaved(v, 1, cfg.kv_rank, cfg.d_rope);
        break;
      case Kind::SwapHalves: v = swap_column_halves(v); break;
      case Kind::Expert: {
        auto [slot, fresh] = experts.try_emplace(e.loom, Tensor());
        if (fresh) slot->second = Tensor::zeros(target.shape());
        const size_t n = static_cast<size_t>(v.numel());
        std::memcpy(slot->second.data<float>() + e.expert * static_cast<int64_t>(n), v.data<float>(), n * sizeof(float));
        return;
      }
    }
    if (e.state) {
      model->load_state(e.loom, v);
    } else {
      model->load_parameter(e.loom, v);
    }
  });
  for (const auto& [name, v] : experts) model->load_parameter(name, v);
  std::optional<Tensor> embed;
  if (!loaded.count("lm_head.weight") && loaded.count("model.embed_tokens.weight")) {
    // Tied embeddings: loom's head is untied, so it gets a copy, which computes the same logits.
    model->load_parameter("lm_head.weight", model->parameter("token_embeddings.weight").value);
    loaded.insert("lm_head.weight");
    out.notes.push_back("lm_head.weight is tied to model.embed_tokens.weight: copied into loom's untied lm_head");
  }
  for (const auto& [e, v] : copies) {
    // loom's MTP modules share the embedding, final norm and head; a checkpoint whose copies differ
    // would compute something loom cannot.
    LOOM_CHECK(v.to_vector<float>() == model->parameter(e.loom).value.to_vector<float>(), config_path, ": '", e.hf,
               "' differs from the main model's ", e.loom, " (loom's MTP shares it)");
  }
  for (const auto& [hf, e] : by_hf) {
    if (e.state && !loaded.count(hf)) {
      out.notes.push_back(str("no '", hf, "': the routing bias starts at zero"));
      continue;
    }
    LOOM_CHECK(loaded.count(hf), "HF import: \"", dir, "\" has no tensor '", hf, "'");
  }
  out.model = std::move(model);
  models::hf_read_tokenizer(dir, out);
  return out;
}

}  // namespace loom::deepseek_v3
