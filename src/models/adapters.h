// LoRA adapters on a whole model (nn/lora.h is one layer's): which layers get one, freezing the rest,
// merging them into the base weights, and PEFT's files.
//
// Targets name layers as PEFT's target_modules do: a target matches a layer when it equals the last
// component of the layer's name, loom's ("q_proj", "w1", "output_proj") or Hugging Face's ("q_proj",
// "gate_proj", "o_proj": the family's tensor table, models/tensor_names.h, gives those), or the whole
// dotted name; "all-linear" takes every linear layer but the LM head (PEFT's meaning). The LM head and
// DeepSeek-V3's router never get one. A target that matches no layer is an error listing the names there are.
// DeepSeek-V3's routed experts, stacked [E, out, in] (nn::ExpertAdaptable), take adapters a stack at a
// time (one per expert): "experts" takes every stack, and so do "all-linear", the stack's last name
// component (w1, w3, w2) and its experts' HF one (gate_proj, up_proj, down_proj); a full name
// (layers.1.moe.experts.w1) takes one stack. PEFT names them per expert:
//   base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight [r, C], .lora_B.weight [F, r].
//
// PEFT's files (peft.PeftModel.from_pretrained reads them onto the transformers model):
//   adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                               "lora_dropout", "target_modules": [HF names], "bias": "none", ...}
//   adapter_model.safetensors  base_model.model.<HF layer>.lora_A.weight [r, in] and .lora_B.weight [out, r]
// where <HF layer> is the HF name of the layer's weight without ".weight"
// ("model.layers.0.self_attn.q_proj"). What the family's table does to a weight, the adapter's factors
// get where it applies: B's rows follow a RoPE row reordering (HF's rotate-half q and k); A and B are
// [r, in] / [out, r] as nn.Linear's even where the base weight is stored transposed (GPT-2's Conv1D).
// Layers whose HF tensor fuses several of loom's (GPT-2's c_attn) have no PEFT name of their own: saving
// them is refused, naming the layer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "nn/layers.h"
#include "nn/lora.h"

namespace loom::models {

struct AdapterConfig {
  nn::LoraOptions lora;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
};

// Every linear layer of the model, in parameter order.
std::vector<nn::Linear*> linear_layers(LanguageModel& model);
// Every stack of expert weights [E, out, in] that takes adapters (DeepSeek-V3's routed experts'
// w1, w3, w2), in module order.
struct ExpertStack {
  nn::ExpertAdaptable* owner;
  nn::Parameter* weight;
};
std::vector<ExpertStack> expert_stacks(LanguageModel& model);
// The HF name of a layer ("model.layers.0.self_attn.q_proj"), "" when the family's table has none for it
// alone (a fused tensor, or a family without HF names).
std::string hf_layer_name(const LanguageModel& model, const nn::Linear& layer);

// Attaches an adapter to every layer a target matches (A drawn from key.fold_in(A's name)); returns them.
std::vector<nn::LoRA*> attach_adapters(LanguageModel& model, const AdapterConfig& config, RngKey key);
// The adapters attached to the model's layers.
std::vector<nn::LoRA*> adapters_of(LanguageModel& model);
// Marks every parameter but the adapters' as needing no gradient (frozen); returns the adapters'
// parameters, the ones to train.
std::vector<nn::Parameter*> freeze_all_but_adapters(LanguageModel& model);
// W += scale * B A for every adapter, which is then detached: the model computes what it computed with
// them, as plain layers (for export).
void merge_adapters(LanguageModel& model);

// PEFT's adapter_config.json for these adapters (`base` names the base model) and the tensors under PEFT's
// names; save_peft_adapter writes both into `dir` (created).
nlohmann::json peft_adapter_config(LanguageModel& model, const AdapterConfig& config, const std::string& base);
std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(LanguageModel& model);
void save_peft_adapter(LanguageModel& model, const AdapterConfig& config, const std::string& base, const std::string& dir);
// Reads PEFT's adapter directory onto a model without adapters: attaches adapters as its config says and
// loads their weights. Refuses what loom cannot compute as PEFT does (DoRA, rsLoRA, per-layer rank or alpha
// patterns, trained biases, modules_to_save), a tensor that names no adapted layer, or a missing one.
AdapterConfig load_peft_adapter(LanguageModel& model, const std::string& dir);

}  // namespace loom::models
