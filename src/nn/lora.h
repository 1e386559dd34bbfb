// LoRA (Hu et al., 2021): a low-rank update trained beside a frozen linear layer,
//   y = x W^T (+ b) + scale * dropout(x) A^T B^T,   scale = alpha / rank,
// with A: [r, in] and B: [out, r] the only trained tensors. Initialised as PEFT's LoraLayer does (its
// default init_lora_weights=True): A ~ kaiming_uniform_(a=sqrt(5)), i.e. uniform(-1/sqrt(in), 1/sqrt(in)),
// and B = 0, so the adapted layer starts out computing exactly the base layer.
//
// A LoRA is attached to an nn::Linear (Linear::attach_lora) and becomes that layer's child module, so its
// parameters are named after the layer: `layers.0.attn.q_proj.lora_A.weight` / `.lora_B.weight` (PEFT's
// module names with loom's layer names; models/adapters.h maps them to PEFT's files). The base layer
// keeps computing as it did (f32, bf16 mixed precision, or held quantized): the update is added to its
// output.
//
// Dropout on the adapter's input (PEFT's lora_dropout) needs a key per forward pass; Linear::forward has
// no ForwardContext, so the trainer opens a LoraDropoutScope around a training forward pass. Each
// adapter folds its layer name into that key, so masks depend on (key, layer, element) only. Outside a
// scope (evaluation, generation) there is no dropout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/parameter.h"
#include "ops/matmul.h"

namespace loom::nn {

struct LoraOptions {
  int64_t rank = 8;
  float alpha = 16.0f;   // scale = alpha / rank (PEFT's default scaling; no rsLoRA)
  float dropout = 0.0f;  // on the adapter's input, in [0, 1)
};

class LoRA : public Module {
 public:
  // `layer`: the adapted layer's name ("layers.0.attn.q_proj"); A is drawn from key.fold_in(A's name).
  // experts > 0: the adapters of a stack of `experts` weights [E, out, in] (DeepSeek-V3's routed experts,
  // `layer` = "layers.1.moe.experts.w1"), one per expert, stacked: A [E, r, in], B [E, out, r], each
  // expert's A initialised as a layer's.
  LoRA(const std::string& layer, int64_t in_features, int64_t out_features, const LoraOptions& options, RngKey key,
       int64_t experts = 0);
  // scale * dropout(x) A^T B^T: x [..., in] -> [..., out] (f32). precision: the base layer's (the adapter's
  // GEMMs round their operands to bf16 under BF16, as the base's do). Not for an expert stack.
  Tensor delta(const Tensor& x, ops::MatmulPrecision precision = ops::MatmulPrecision::F32) const;
  // delta(x), the same bits, for an x that recompute_x() rebuilds bit for bit: A's GEMM keeps no x for dA
  // (ops::linear_recomputed_input). Plain delta(x) under dropout, BF16 precision or a non-f32 x.
  Tensor delta(const Tensor& x, ops::MatmulPrecision precision, std::function<Tensor()> recompute_x) const;
  // An expert stack's adapted weights w + scale * B A: [E, out, in], differentiable w.r.t. A and B (and w).
  // The experts' sparse kernels (ops::moe_experts) then multiply each token by its experts' adapted
  // weights: per expert exactly x (W + s B A)^T, which merging computes too (no dropout: refused).
  Tensor adapted(const Tensor& w) const;
  // scale * B A: [out, in] (an expert stack: [E, out, in]), what merging adds to the base weight (no autodiff).
  Tensor merged_delta() const;

  std::string layer;
  int64_t rank;
  float alpha, scale, dropout;
  int64_t experts;  // 0: one layer's adapter
  Parameter& A;  // [r, in]   <layer>.lora_A.weight   (an expert stack: [E, r, in])
  Parameter& B;  // [out, r]  <layer>.lora_B.weight   (an expert stack: [E, out, r])
};

// A module holding stacked expert weights [E, out, in] whose experts take adapters (DeepSeek-V3's MoE);
// models/adapters.h finds them through this interface, as it finds nn::Linear layers.
class ExpertAdaptable {
 public:
  virtual ~ExpertAdaptable() = default;
  // The stacked weights, in parameter order.
  virtual std::vector<Parameter*> expert_weights() = 0;
  // The adapter of one of them (null when none); attaching makes it a child module of this one.
  virtual LoRA* expert_lora(const Parameter& weight) = 0;
  virtual LoRA& attach_expert_lora(const Parameter& weight, const LoraOptions& options, RngKey key) = 0;
  virtual std::unique_ptr<LoRA> detach_expert_lora(const Parameter& weight) = 0;
};

// The dropout key of the adapters' forward passes on this thread while it lives (nestable; nullopt: none).
class LoraDropoutScope {
 public:
  explicit LoraDropoutScope(std::optional<RngKey> key);
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;

 private:
  std::optional<RngKey> previous_;
};

}  // namespace loom::nn
