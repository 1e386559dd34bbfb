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
#include "ops/shape.h"

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

void collect_expert_stacks(nn::Module& m, std::vector<ExpertStack>& out) {
  if (auto* e = dynamic_cast<nn::ExpertAdaptable*>(&m)) {
    for (nn::Parameter* w : e->expert_weights()) out.push_back({e, w});
  }
  for (nn::Module* child : m.children()) collect_expert_stacks(*child, out);
}

// Every adapter in module order: a layer's, and an expert stack's after its MoE's other layers'.
void collect_adapters(nn::Module& m, std::vector<nn::LoRA*>& out) {
  if (auto* l = dynamic_cast<nn::Linear*>(&m); l != nullptr && l->lora) out.push_back(l->lora.get());
  for (nn::Module* child : m.children()) collect_adapters(*child, out);
  if (auto* e = dynamic_cast<nn::ExpertAdaptable*>(&m)) {
    for (nn::Parameter* w : e->expert_weights()) {
      if (nn::LoRA* a = e->expert_lora(*w)) out.push_back(a);
    }
  }
}

// Expert e's HF layer name, "model.layers.1.mlp.experts.3.gate_proj" (the family's Slice row), per expert.
std::vector<std::string> hf_expert_names(const LanguageModel& model, const nn::Parameter& stack) {
  std::vector<std::string> out;
  const TensorTable* table = table_of(model);
  if (table == nullptr) return out;
  for (const StoredTensor& t : stored_tensors(*table, TensorFormat::Hf, model.model_config().json())) {
    if (t.change != Change::Slice || t.loom.size() != 1 || t.loom[0] != stack.name) continue;
    if (out.size() <= static_cast<size_t>(t.index)) out.resize(static_cast<size_t>(t.index) + 1);
    out[static_cast<size_t>(t.index)] = t.name.ends_with(".weight") ? t.name.substr(0, t.name.size() - 7) : t.name;
  }
  if (static_cast<int64_t>(out.size()) != stack.value.size(0) ||
      std::any_of(out.begin(), out.end(), [](const std::string& n) { return n.empty(); })) {
    out.clear();
  }
  return out;
}

}  // namespace

std::vector<ExpertStack> expert_stacks(LanguageModel& model) {
  std::vector<ExpertStack> out;
  collect_expert_stacks(model, out);
  return out;
}

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
  // Routed experts: "experts" takes every stack; a stack's loom name or its last component (w1), or the
  // HF name of its experts' layers (gate_proj: PEFT's suffix match over model.layers.1.mlp.experts.3.gate_proj)
  // takes it. A stack is adapted whole: every expert gets its own adapter.
  const std::vector<ExpertStack> stacks = expert_stacks(model);
  for (const ExpertStack& s : stacks) {
    const std::string& loom = s.weight->name;
    const std::vector<std::string> hf = hf_expert_names(model, *s.weight);
    bool hit = false;
    for (const std::string& t : config.targets) {
      const bool match = t == "all-linear" || t == "experts" || t == loom || t == last_component(loom) ||
                         (!hf.empty() && t == last_component(hf[0]));
      if (match) matched_targets.insert(t);
      hit |= match;
    }
    if (hit) out.push_back(&s.owner->attach_expert_lora(*s.weight, config.lora, key));
  }
  for (const std::string& t : config.targets) {
    if (matched_targets.count(t)) continue;
    std::set<std::string> names;
    for (nn::Linear* l : layers) {
      if (!adaptable(*l)) continue;
      names.insert(last_component(l->name()));
      if (std::string hf = hf_layer_name(model, *l); !hf.empty()) names.insert(last_component(hf));
    }
    if (!stacks.empty()) names.insert("experts");
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    LOOM_FAIL("LoRA: target '", t, "' matches no layer of this ", model.arch(), " model; its linear layers are: ", list,
              " (or all-linear)");
  }
  return out;
}

std::vector<nn::LoRA*> adapters_of(LanguageModel& model) {
  std::vector<nn::LoRA*> out;
  collect_adapters(model, out);
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
  for (const ExpertStack& s : expert_stacks(model)) {
    nn::LoRA* a = s.owner->expert_lora(*s.weight);
    if (a == nullptr) continue;
    Tensor w = s.weight->value;
    ops::add_(w, a->merged_delta());  // W + s B A, as LoRA::adapted forms it in the forward
    s.weight->value_changed();
    s.owner->detach_expert_lora(*s.weight);
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
  for (const ExpertStack& s : expert_stacks(model)) {  // each expert is a module of its own in HF's model
    const bool adapted_stack = s.owner->expert_lora(*s.weight) != nullptr;
    for (const std::string& hf : hf_expert_names(model, *s.weight)) {
      auto& [adapted, all] = by_short[last_component(hf)];
      ++all;
      if (adapted_stack) {
        ++adapted;
        adapted_full.push_back(hf);
      }
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
  // An expert stack's adapters as one pair per expert, under that expert's HF layer:
  // base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight [r, in], .lora_B.weight [out, r].
  for (const ExpertStack& s : expert_stacks(model)) {
    nn::LoRA* lora = s.owner->expert_lora(*s.weight);
    if (lora == nullptr) continue;
    const std::vector<std::string> hf = hf_expert_names(model, *s.weight);
    LOOM_CHECK(!hf.empty(), s.weight->name, ": the family's tensor table names no Hugging Face layer per expert, so "
               "PEFT cannot name its adapters; leave the experts out of the targets to save a PEFT adapter");
    const Tensor A = lora->A.value.detach(), B = lora->B.value.detach();
    for (size_t e = 0; e < hf.size(); ++e) {
      const auto i = static_cast<int64_t>(e);
      out.emplace_back(kPeftPrefix + hf[e] + ".lora_A.weight", ops::reshape(A.slice(i, 1), {A.size(1), A.size(2)}).clone());
      out.emplace_back(kPeftPrefix + hf[e] + ".lora_B.weight", ops::reshape(B.slice(i, 1), {B.size(1), B.size(2)}).clone());
    }
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
  // HF layer -> loom's, from the layers' own HF names (the table read forward: a pattern such as
  // model.layers.{i} would also read DeepSeek-V3's MTP layers, model.layers.{k+num_layers}, as blocks).
  std::map<std::string, nn::Linear*> by_hf;
  for (nn::Linear* l : linear_layers(model)) {
    if (std::string hf = hf_layer_name(model, *l); !hf.empty()) by_hf[hf] = l;
  }
  // Routed experts: HF layer -> (stack, expert), and per stack the experts' (A, B) from the file.
  const std::vector<ExpertStack> stacks = expert_stacks(model);
  std::map<std::string, std::pair<size_t, int64_t>> expert_by_hf;
  for (size_t i = 0; i < stacks.size(); ++i) {
    const std::vector<std::string> hf = hf_expert_names(model, *stacks[i].weight);
    for (size_t e = 0; e < hf.size(); ++e) expert_by_hf[hf[e]] = {i, static_cast<int64_t>(e)};
  }
  std::map<size_t, std::map<int64_t, std::pair<Tensor, Tensor>>> expert_factors;
  // Layer -> (A, B) from the file.
  std::map<nn::Linear*, std::pair<Tensor, Tensor>> factors;
  for (const std::string& name : file.names()) {
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    LOOM_CHECK(name.rfind(kPeftPrefix, 0) == 0 && (is_a || is_b), weights_path, ": tensor '", name,
               "' is not a LoRA factor (base_model.model.<layer>.lora_A.weight / .lora_B.weight)");
    const std::string hf = name.substr(std::strlen(kPeftPrefix), name.size() - std::strlen(kPeftPrefix) - 14);
    if (auto it = expert_by_hf.find(hf); it != expert_by_hf.end()) {
      Tensor t = file.tensor(name);
      LOOM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, weights_path, ": ", name, " is ", t.dtype(),
                 " (f32 or bf16 are read)");
      auto& ab = expert_factors[it->second.first][it->second.second];
      (is_a ? ab.first : ab.second) = t.to(DType::F32);
      continue;
    }
    const auto layer = by_hf.find(hf);
    LOOM_CHECK(layer != by_hf.end(), weights_path, ": tensor '", name, "' adapts '", hf,
               "', which is no linear layer of loom's ", model.arch());
    Tensor t = file.tensor(name);
    LOOM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, weights_path, ": ", name, " is ", t.dtype(),
               " (f32 or bf16 are read)");
    (is_a ? factors[layer->second].first : factors[layer->second].second) = t.to(DType::F32);
  }
  LOOM_CHECK(!factors.empty() || !expert_factors.empty(), weights_path, " holds no LoRA factor");
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
  // A stack takes adapters on every expert: the experts the file leaves out get A = B = 0, which adds
  // exactly nothing (W + s * 0 = W).
  for (auto& [i, experts] : expert_factors) {
    const ExpertStack& s = stacks[i];
    nn::LoRA& lora = s.owner->attach_expert_lora(*s.weight, config.lora, RngKey{});
    const int64_t r = lora.rank;
    const Shape a_shape{r, lora.A.value.size(2)}, b_shape{lora.B.value.size(1), r};
    Tensor A = Tensor::zeros(lora.A.value.shape()), B = Tensor::zeros(lora.B.value.shape());
    const std::vector<std::string> names = hf_expert_names(model, *s.weight);
    for (auto& [e, ab] : experts) {
      const std::string& hf = names[static_cast<size_t>(e)];
      LOOM_CHECK(ab.first.defined() && ab.second.defined(), weights_path, ": ", hf, " has only one of lora_A and lora_B");
      LOOM_CHECK(ab.first.shape() == a_shape && ab.second.shape() == b_shape, weights_path, ": ", hf, "'s lora_A is ",
                 ab.first.shape(), " and lora_B ", ab.second.shape(), ", expected ", a_shape, " and ", b_shape, " (r=",
                 r, ")");
      std::memcpy(A.data<float>() + e * a_shape.numel(), ab.first.data<float>(), static_cast<size_t>(a_shape.numel()) * sizeof(float));
      std::memcpy(B.data<float>() + e * b_shape.numel(), ab.second.data<float>(), static_cast<size_t>(b_shape.numel()) * sizeof(float));
    }
    lora.A.value.copy_from(A);
    lora.B.value.copy_from(B);
    config.targets.push_back(s.weight->name);
  }
  return config;
}

}  // namespace loom::models
