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
#include <optional>
#include <string>

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
  LoRA(const std::string& layer, int64_t in_features, int64_t out_features, const LoraOptions& options, RngKey key);
  // scale * dropout(x) A^T B^T: x [..., in] -> [..., out] (f32). precision: the base layer's (the adapter's
  // GEMMs round their operands to bf16 under BF16, as the base's do).
  Tensor delta(const Tensor& x, ops::MatmulPrecision precision = ops::MatmulPrecision::F32) const;
  // scale * B A: [out, in], what merging adds to the base weight (no autodiff).
  Tensor merged_delta() const;

  std::string layer;
  int64_t rank;
  float alpha, scale, dropout;
  Parameter& A;  // [r, in]   <layer>.lora_A.weight
  Parameter& B;  // [out, r]  <layer>.lora_B.weight
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
