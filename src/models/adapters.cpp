#include "models/adapters.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/autograd.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/tensor_names.h"
#include "ops/elementwise.h"

namespace loom::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

void collect_linears(nn::Module& m, std::vector<nn::Linear*>& out) {
  if (auto* l = dynamic_cast<nn::Linear*>(&m)) out.push_back(l);
  for (nn::Module* child : m.children()) collect_linears(*child, out);
}

std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Layers that never get an adapter: the LM head (PEFT leaves it out of all-linear too) and DeepSeek-V3's
// router (its logits pick experts; loom keeps it f32 and exact).
bool adaptable(const nn::Linear& l) {
  const std::string name = l.name();
  return name != "lm_head" && last_component(name) != "router";
}

const TensorTable* table_of(const LanguageModel& model) {
  const Family& f = model.model_config().family();
  return f.tensor_table ? &f.tensor_table() : nullptr;
}

const TensorName* hf_row(const LanguageModel& model, const nn::Linear& layer) {
  const TensorTable* table = table_of(model);
  if (table == nullptr) return nullptr;
  const TensorName* row = row_for(*table, TensorFormat::Hf, layer.weight.name, &model.model_config().json());
  return row != nullptr && row->how.part.count == 1 ? row : nullptr;
}

// [R, 2C] with its column halves swapped (what Change::SwapColumnHalves does to the weight does this to A).
Tensor swap_column_halves(const Tensor& a) {
  const int64_t R = a.size(0), C2 = a.size(1), C = C2 / 2;
  Tensor out = a.clone();
  const float* src = a.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(dst + r * C2, src + r * C2 + C, static_cast<size_t>(C) * sizeof(float));
    std::memcpy(dst + r * C2 + C, src + r * C2, static_cast<size_t>(C) * sizeof(float));
  }
  return out;
}

// A and B as PEFT stores them (to_peft), or back.
std::pair<Tensor, Tensor> convert_factors(const LanguageModel& model, const TensorName& row, Tensor a, Tensor b,
                                          bool to_peft) {
  switch (row.how.hf) {
    case Change::RopeToRotateHalf:
    case Change::RopeToInterleaved: {
      const bool stored_interleaved = row.how.hf == Change::RopeToInterleaved;
      b = reorder_rope_rows(b, row.how.rope(model.model_config().json()), stored_interleaved == to_peft);
      break;
    }
    case Change::SwapColumnHalves: a = swap_column_halves(a); break;
    default: break;  // Transpose: nn.Linear's A and B are [r, in] / [out, r] whatever the base's storage
  }
  return {a, b};
}

}  // namespace

std::vector<nn::Linear*> linear_layers(LanguageModel& model) {
  std::vector<nn::Linear*> out;
  collect_linears(model, out);
  return out;
}

std::string hf_layer_name(const LanguageModel& model, const nn::Linear& layer) {
  if (hf_row(model, layer) == nullptr) return "";
  const std::string w = stored_name(*table_of(model), TensorFormat::Hf, layer.weight.name, &model.model_config().json());
  return w.ends_with(".weight") ? w.substr(0, w.size() - 7) : w;
}

std::vector<nn::LoRA*> attach_adapters(LanguageModel& model, const AdapterConfig& config, RngKey key) {
  LOOM_CHECK(!config.targets.empty(), "LoRA: no target layers given");
  std::vector<nn::Linear*> layers = linear_layers(model);
  std::set<std::string> matched_targets;
  std::vector<nn::LoRA*> out;
  for (nn::Linear* l : layers) {
    if (!adaptable(*l)) continue;
    const std::string loom = l->name(), hf = hf_layer_name(model, *l);
    bool hit = false;
    for (const std::string& t : config.targets) {
      const bool match = t == "all-linear" || t == loom || t == last_component(loom) ||
                         (!hf.empty() && (t == hf || t == last_component(hf)));
      if (match) matched_targets.insert(t);
      hit |= match;
    }
    if (hit) out.push_back(&l->attach_lora(config.lora, key));
  }
  for (const std::string& t : config.targets) {
    if (matched_targets.count(t)) continue;
    std::set<std::string> names;
    for (nn::Linear* l : layers) {
      if (!adaptable(*l)) continue;
      names.insert(last_component(l->name()));
      if (std::string hf = hf_layer_name(model, *l); !hf.empty()) names.insert(last_component(hf));
    }
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    LOOM_FAIL("LoRA: target '", t, "' matches no layer of this ", model.arch(), " model; its linear layers are: ", list,
              " (or all-linear)");
  }
  return out;
}

std::vector<nn::LoRA*> adapters_of(LanguageModel& model) {
  std::vector<nn::LoRA*> out;
  for (nn::Linear* l : linear_layers(model)) {
    if (l->lora) out.push_back(l->lora.get());
  }
  return out;
}

std::vector<nn::Parameter*> freeze_all_but_adapters(LanguageModel& model) {
  std::set<const nn::Parameter*> trained;
  std::vector<nn::Parameter*> out;
  for (nn::LoRA* a : adapters_of(model)) {
    for (nn::Parameter* p : {&a->A, &a->B}) {
      trained.insert(p);
      out.push_back(p);
    }
  }
  for (nn::Parameter* p : model.parameters()) p->value.set_requires_grad(trained.count(p) > 0);
  return out;
}

void merge_adapters(LanguageModel& model) {
  autograd::NoGradGuard no_grad;
  for (nn::Linear* l : linear_layers(model)) {
    if (!l->lora) continue;
    LOOM_CHECK(!l->quantized, l->name(), ": merging a LoRA adapter into a weight held quantized would round the sum "
               "again; merge into the f32 weights (load the base dequantized)");
    Tensor w = l->weight.value;
    ops::add_(w, l->lora->merged_delta());
    l->weight.value_changed();
    l->detach_lora();
  }
}

json peft_adapter_config(LanguageModel& model, const AdapterConfig& config, const std::string& base) {
  // Short names where every layer of that name is adapted (PEFT matches a suffix), else full names.
  std::map<std::string, std::pair<int, int>> by_short;  // HF short name -> (adapted, all)
  std::vector<std::string> adapted_full;
  for (nn::Linear* l : linear_layers(model)) {
    const std::string hf = hf_layer_name(model, *l);
    if (hf.empty()) continue;
    auto& [adapted, all] = by_short[last_component(hf)];
    ++all;
    if (l->lora) {
      ++adapted;
      adapted_full.push_back(hf);
    }
  }
  std::set<std::string> targets;
  for (const std::string& hf : adapted_full) {
    const auto& [adapted, all] = by_short[last_component(hf)];
    targets.insert(adapted == all ? last_component(hf) : hf);
  }
  return json{{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"base_model_name_or_path", base},
              {"r", config.lora.rank},
              {"lora_alpha", config.lora.alpha},
              {"lora_dropout", config.lora.dropout},
              {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"use_rslora", false},
              {"use_dora", false},
              {"modules_to_save", nullptr},
              {"layers_to_transform", nullptr},
              {"rank_pattern", json::object()},
              {"alpha_pattern", json::object()},
              {"revision", nullptr}};
}

std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(LanguageModel& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (nn::Linear* l : linear_layers(model)) {
    if (!l->lora) continue;
    const TensorName* row = hf_row(model, *l);
    LOOM_CHECK(row != nullptr, l->name(), ": this layer has no Hugging Face name of its own (",
               table_of(model) ? "its HF tensor fuses several of loom's layers" : "the family has no HF names",
               "), so PEFT cannot name its adapter; leave it out of the targets to save a PEFT adapter");
    const std::string hf = kPeftPrefix + hf_layer_name(model, *l);
    auto [a, b] = convert_factors(model, *row, l->lora->A.value.detach(), l->lora->B.value.detach(), true);
    out.emplace_back(hf + ".lora_A.weight", a);
    out.emplace_back(hf + ".lora_B.weight", b);
  }
  LOOM_CHECK(!out.empty(), "PEFT adapter: the model has no LoRA adapter to save");
  return out;
}

void save_peft_adapter(LanguageModel& model, const AdapterConfig& config, const std::string& base, const std::string& dir) {
  const auto tensors = peft_adapter_tensors(model);
  fs::create_directories(dir);
  io::write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors);
  const std::string text = peft_adapter_config(model, config, base).dump(2) + "\n";
  io::write_file_atomically((fs::path(dir) / "adapter_config.json").string(),
                            [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

AdapterConfig load_peft_adapter(LanguageModel& model, const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const json c = io::read_json_file(config_path, "PEFT adapter config");
  auto refuse_if = [&](bool bad, const std::string& key) {
    LOOM_CHECK(!bad, config_path, ": ", key, " = ", io::brief_json(c.value(key, json())),
               " is not supported (loom computes plain LoRA: use_rslora and use_dora false, no rank or alpha "
               "patterns, bias \"none\", no modules_to_save)");
  };
  LOOM_CHECK(c.is_object() && c.value("peft_type", std::string()) == "LORA", config_path,
             ": peft_type must be \"LORA\", got ", io::brief_json(c.is_object() ? c.value("peft_type", json()) : c));
  refuse_if(c.value("use_rslora", false) != false, "use_rslora");
  refuse_if(c.value("use_dora", false) != false, "use_dora");
  refuse_if(c.contains("rank_pattern") && !c["rank_pattern"].is_null() && !c["rank_pattern"].empty(), "rank_pattern");
  refuse_if(c.contains("alpha_pattern") && !c["alpha_pattern"].is_null() && !c["alpha_pattern"].empty(), "alpha_pattern");
  refuse_if(c.value("bias", std::string("none")) != "none", "bias");
  refuse_if(c.contains("modules_to_save") && !c["modules_to_save"].is_null() && !c["modules_to_save"].empty(),
            "modules_to_save");
  LOOM_CHECK(c.contains("r") && c["r"].is_number_integer(), config_path, ": r must be an integer");
  LOOM_CHECK(c.contains("lora_alpha") && c["lora_alpha"].is_number(), config_path, ": lora_alpha must be a number");
  AdapterConfig config;
  config.lora.rank = c["r"].get<int64_t>();
  config.lora.alpha = c["lora_alpha"].get<float>();
  config.lora.dropout = c.value("lora_dropout", 0.0f);
  config.targets.clear();
  LOOM_CHECK(adapters_of(model).empty(), "PEFT adapter: the model already has LoRA adapters");

  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  const io::SafetensorsFile file = io::SafetensorsFile::open(weights_path);
  const TensorTable* table = table_of(model);
  LOOM_CHECK(table != nullptr, "PEFT adapter: the ", model.arch(), " family has no Hugging Face names");
  std::map<std::string, nn::Linear*> by_weight;
  for (nn::Linear* l : linear_layers(model)) by_weight[l->weight.name] = l;
  // Layer -> (A, B) from the file.
  std::map<nn::Linear*, std::pair<Tensor, Tensor>> factors;
  for (const std::string& name : file.names()) {
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    LOOM_CHECK(name.rfind(kPeftPrefix, 0) == 0 && (is_a || is_b), weights_path, ": tensor '", name,
               "' is not a LoRA factor (base_model.model.<layer>.lora_A.weight / .lora_B.weight)");
    const std::string hf = name.substr(std::strlen(kPeftPrefix), name.size() - std::strlen(kPeftPrefix) - 14);
    const auto loom = loom_name(*table, TensorFormat::Hf, hf + ".weight", &model.model_config().json());
    LOOM_CHECK(loom && by_weight.count(*loom), weights_path, ": tensor '", name, "' adapts '", hf,
               "', which is no linear layer of loom's ", model.arch());
    Tensor t = file.tensor(name);
    LOOM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, weights_path, ": ", name, " is ", t.dtype(),
               " (f32 or bf16 are read)");
    (is_a ? factors[by_weight[*loom]].first : factors[by_weight[*loom]].second) = t.to(DType::F32);
  }
  LOOM_CHECK(!factors.empty(), weights_path, " holds no LoRA factor");
  for (auto& [layer, ab] : factors) {
    LOOM_CHECK(ab.first.defined() && ab.second.defined(), weights_path, ": ", layer->name(), " has only one of lora_A and lora_B");
    nn::LoRA& lora = layer->attach_lora(config.lora, RngKey{});
    const TensorName* row = hf_row(model, *layer);
    LOOM_CHECK(row != nullptr, weights_path, ": ", layer->name(), " has no Hugging Face name of its own");
    LOOM_CHECK(ab.first.shape() == lora.A.value.shape() && ab.second.shape() == lora.B.value.shape(), weights_path,
               ": ", layer->name(), "'s lora_A is ", ab.first.shape(), " and lora_B ", ab.second.shape(), ", expected ",
               lora.A.value.shape(), " and ", lora.B.value.shape(), " (r=", config.lora.rank, ")");
    auto [a, b] = convert_factors(model, *row, ab.first, ab.second, false);
    lora.A.value.copy_from(a);
    lora.B.value.copy_from(b);
    config.targets.push_back(layer->name());
  }
  return config;
}

}  // namespace loom::models
