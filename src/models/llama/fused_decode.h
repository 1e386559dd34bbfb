// Whether the Llama decodes a single token with the fused step (ops/decode_step.h: one parallel region
// per token instead of one per op, the op-by-op path's logits bit for bit), and the step's description
// of the model's weights. Decided when the model's layers change (nn::Module::layers_changed: a weight
// quantized or not, parameters sharded), never per token: TransformerLM keeps the plan.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/paged_decoder.h"
#include "ops/decode_step.h"

namespace loom::llama {

class TransformerLM;

struct FusedDecodePlan {
  std::shared_ptr<const ops::DecodeStep> step;  // null when the model cannot run it
  std::string unsupported;                      // then why not (e.g. "layers.0.ffn.w2.weight is not held quantized")
};

// The plan for `model` as it is now: every Linear of the layers and the head held quantized (by a type
// with integer kernels), no biases, no parameter sharded over a mesh, RoPE, f32 CPU embedding and norms,
// and a head dim that is a multiple of 8.
FusedDecodePlan plan_fused_decode(const TransformerLM& model);

// The model as nn/paged_decoder.h's decoder (batched serving): each Linear f32 on the CPU or held quantized
// by a type with kernels, none sharded, no biases, RoPE, f32 CPU embeddings and norms. nullopt otherwise,
// with the reason in *why when given.
std::optional<nn::DecoderWeights> decoder_weights_of(const TransformerLM& model, std::string* why = nullptr);

}  // namespace loom::llama
