#include "models/gpt2/hf.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "models/gpt2/model.h"
#include "models/hf.h"

namespace loom::gpt2 {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// [R, C] f32 -> [C, R] (HF's Conv1D [in, out] <-> loom's Linear [out, in]).
Tensor transposed(const Tensor& w) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2, "gpt2 HF: expected an f32 matrix, got ",
             w.describe());
  const int64_t R = w.size(0), C = w.size(1);
  Tensor out = Tensor::empty({C, R}, DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) dst[c * R + r] = src[r * C + c];
  }
  return out;
}

// Rows [begin, begin + n) of a [R, C] matrix, or elements of a vector, as a new tensor.
Tensor rows(const Tensor& t, int64_t begin, int64_t n) { return t.slice(begin, n).clone(); }

// Stacks tensors along dim 0.
Tensor stacked(const std::vector<Tensor>& parts) {
  int64_t R = 0;
  for (const Tensor& p : parts) R += p.size(0);
  std::vector<int64_t> dims(parts[0].shape().begin(), parts[0].shape().end());
  dims[0] = R;
  Tensor out = Tensor::empty(Shape(dims), DType::F32);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const Tensor& c = p;
    std::memcpy(out.data<float>() + at, c.data<float>(), static_cast<size_t>(c.numel()) * sizeof(float));
    at += c.numel();
  }
  return out;
}

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

// HF name (without "transformer.") -> what it is: the loom layer and the HF leaf, or a whole-model name.
struct HfName {
  int64_t layer = -1;  // -1: not in a block
  std::string leaf;    // "attn.c_attn.weight", "wte.weight", ...
};

std::optional<HfName> parse_hf_name(std::string n) {
  if (n.rfind("transformer.", 0) == 0) n = n.substr(12);
  static const std::regex block(R"(h\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(n, m, block)) {
    if (m[1].str().size() > 9) return std::nullopt;
    return HfName{std::stoll(m[1].str()), m[2].str()};
  }
  return HfName{-1, n};
}

}  // namespace

void export_hf(const models::LanguageModel& base, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const auto* gpt = dynamic_cast<const GPT2*>(&base);
  LOOM_CHECK(gpt != nullptr, "gpt2::export_hf: the model is a ", base.arch(), ", not a gpt2");
  const Config& c = gpt->config();
  const int64_t C = c.d_model;
  io::NamedTensors tensors;
  auto add = [&](const std::string& name, const Tensor& t) { tensors.emplace_back(name, t.detach()); };
  auto bias_or_zeros = [&](const nn::Linear& l) { return l.bias ? l.bias->value.detach() : Tensor::zeros({l.weight.value.size(0)}); };
  add("transformer.wte.weight", gpt->token_embeddings.weight.value);
  add("transformer.wpe.weight", gpt->position_embeddings.weight.value);
  for (size_t i = 0; i < gpt->layers.size(); ++i) {
    const Block& b = *gpt->layers[i];
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", b.ln1.weight.value);
    add(p + "ln_1.bias", b.ln1.bias.value);
    add(p + "attn.c_attn.weight", transposed(stacked({b.attn.q_proj.weight.value.detach(), b.attn.k_proj.weight.value.detach(),
                                                      b.attn.v_proj.weight.value.detach()})));
    add(p + "attn.c_attn.bias", stacked({bias_or_zeros(b.attn.q_proj), bias_or_zeros(b.attn.k_proj), bias_or_zeros(b.attn.v_proj)}));
    add(p + "attn.c_proj.weight", transposed(b.attn.output_proj.weight.value.detach()));
    add(p + "attn.c_proj.bias", bias_or_zeros(b.attn.output_proj));
    add(p + "ln_2.weight", b.ln2.weight.value);
    add(p + "ln_2.bias", b.ln2.bias.value);
    add(p + "mlp.c_fc.weight", transposed(b.mlp.fc.weight.value.detach()));
    add(p + "mlp.c_fc.bias", b.mlp.fc.bias->value);
    add(p + "mlp.c_proj.weight", transposed(b.mlp.proj.weight.value.detach()));
    add(p + "mlp.c_proj.bias", b.mlp.proj.bias->value);
  }
  add("transformer.ln_f.weight", gpt->ln_final.weight.value);
  add("transformer.ln_f.bias", gpt->ln_final.bias.value);
  if (gpt->lm_head) add("lm_head.weight", gpt->lm_head->weight.value);
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

  std::optional<int64_t> eot = models::hf_end_of_text(tok);
  const double p = static_cast<double>(c.dropout);
  json config = {{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", c.vocab_size},
                 {"n_positions", c.context_length},
                 {"n_ctx", c.context_length},
                 {"n_embd", C},
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
  json generation = {{"_from_model_config", true}};
  if (eot) {
    for (json* j : {&config, &generation}) {
      (*j)["bos_token_id"] = *eot;
      (*j)["eos_token_id"] = *eot;
    }
  }
  models::hf_write_json(fs::path(out_dir) / "config.json", config);
  models::hf_write_json(fs::path(out_dir) / "generation_config.json", generation);
  if (tok) models::hf_write_tokenizer(*tok, out_dir, c.context_length, /*gpt2_files=*/true);
}

models::HfImport import_hf(const std::string& dir, const json& hf_config) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const Config cfg = config_from_hf(hf_config, config_path);
  const int64_t C = cfg.d_model;
  auto model = std::make_unique<GPT2>(cfg, 0);
  std::set<std::string> loaded;
  std::optional<Tensor> head;
  // Loads `value` into a loom parameter, shape-checked against it.
  auto put = [&](const std::string& file, const std::string& hf, const std::string& name, const Tensor& value) {
    nn::Parameter& p = model->parameter(name);
    LOOM_CHECK(value.shape() == p.value.shape(), file, ": '", hf, "' gives ", name, " shape ", value.shape(),
               " but config.json implies ", p.value.shape());
    LOOM_CHECK(loaded.insert(name).second, file, ": '", hf, "' sets ", name, " a second time");
    model->load_parameter(name, value);
  };
  static const std::map<std::string, std::string> whole = {{"wte.weight", "token_embeddings.weight"},
                                                           {"wpe.weight", "position_embeddings.weight"},
                                                           {"ln_f.weight", "ln_final.weight"},
                                                           {"ln_f.bias", "ln_final.bias"}};
  static const std::map<std::string, std::pair<std::string, bool>> within = {  // leaf -> (loom leaf, transpose)
      {"ln_1.weight", {"ln1.weight", false}},         {"ln_1.bias", {"ln1.bias", false}},
      {"ln_2.weight", {"ln2.weight", false}},         {"ln_2.bias", {"ln2.bias", false}},
      {"attn.c_proj.weight", {"attn.output_proj.weight", true}}, {"attn.c_proj.bias", {"attn.output_proj.bias", false}},
      {"mlp.c_fc.weight", {"mlp.fc.weight", true}},   {"mlp.c_fc.bias", {"mlp.fc.bias", false}},
      {"mlp.c_proj.weight", {"mlp.proj.weight", true}}, {"mlp.c_proj.bias", {"mlp.proj.bias", false}}};
  models::hf_for_each_tensor(dir, [&](const io::SafetensorsFile& file, const std::string& hf) {
    auto parsed = parse_hf_name(hf);
    auto unknown = [&] {
      LOOM_FAIL(file.path(), ": tensor '", hf, "' is not part of a GPT-2 (loom reads GPT2LMHeadModel's and OpenAI's names)");
    };
    if (!parsed) unknown();
    if (parsed->layer < 0) {
      if (parsed->leaf == "lm_head.weight") {
        head = models::hf_read_as_f32(file, hf);
        return;
      }
      auto it = whole.find(parsed->leaf);
      if (it == whole.end()) unknown();
      put(file.path(), hf, it->second, models::hf_read_as_f32(file, hf));
      return;
    }
    LOOM_CHECK(parsed->layer < cfg.num_layers, file.path(), ": tensor '", hf, "' is for layer ", parsed->layer,
               " but config.json has n_layer = ", cfg.num_layers);
    const std::string prefix = "layers." + std::to_string(parsed->layer) + ".";
    const std::string& leaf = parsed->leaf;
    if (leaf == "attn.bias" || leaf == "attn.masked_bias") return;  // causal-mask buffers, not weights
    if (leaf == "attn.c_attn.weight" || leaf == "attn.c_attn.bias") {
      Tensor v = models::hf_read_as_f32(file, hf);
      const bool weight = leaf.ends_with("weight");
      const Shape expected = weight ? Shape({C, 3 * C}) : Shape({3 * C});
      LOOM_CHECK(v.shape() == expected, file.path(), ": '", hf, "' has shape ", v.shape(), " but config.json implies ",
                 expected);
      Tensor rows_of = weight ? transposed(v) : v;  // [3C, C] or [3C]
      const char* names[] = {"q_proj", "k_proj", "v_proj"};
      for (int64_t i = 0; i < 3; ++i) {
        put(file.path(), hf, prefix + "attn." + names[i] + (weight ? ".weight" : ".bias"), rows(rows_of, i * C, C));
      }
      return;
    }
    auto it = within.find(leaf);
    if (it == within.end()) unknown();
    Tensor v = models::hf_read_as_f32(file, hf);
    if (it->second.second) {
      LOOM_CHECK(v.shape().ndim() == 2, file.path(), ": '", hf, "' must be a matrix, has shape ", v.shape());
      v = transposed(v);
    }
    put(file.path(), hf, prefix + it->second.first, v);
  });

  models::HfImport out;
  if (cfg.tie_embeddings) {
    if (head && loaded.count("token_embeddings.weight")) {
      const Tensor& wte = model->token_embeddings.weight.value;
      LOOM_CHECK(head->shape() == wte.shape() &&
                     std::memcmp(head->data<float>(), wte.data<float>(), static_cast<size_t>(wte.numel()) * 4) == 0,
                 "HF import: \"", dir, "\" has tie_word_embeddings but its lm_head.weight differs from wte.weight");
    }
  } else {
    LOOM_CHECK(head.has_value(), "HF import: \"", dir, "\" has tie_word_embeddings = false but no lm_head.weight");
    put(dir, "lm_head.weight", "lm_head.weight", *head);
  }
  for (nn::Parameter* p : model->parameters()) {
    LOOM_CHECK(loaded.count(p->name), "HF import: \"", dir, "\" has no tensor for loom's ", p->name);
  }
  out.model = std::move(model);
  models::hf_read_tokenizer(dir, out);
  return out;
}

}  // namespace loom::gpt2
