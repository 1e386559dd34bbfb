// The model interface: what the trainer, checkpoints, evaluation, generation, benchmarks, the CLI and
// Python know about a model, whatever its family (llama, gpt2, ...).
//
// A family lives in src/models/<family>/ and implements LanguageModel plus a Family record (family.h)
// that builds it from the `model` section of a config. Nothing outside a family's folder names its
// classes; the one line that registers it is in src/models/registry.cpp.
//
// Legend: B batch, T sequence, V vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/decode_cache.h"
#include "nn/paged_decoder.h"
#include "models/model_config.h"
#include "models/stats.h"
#include "nn/parameter.h"
#include "ops/matmul.h"

namespace loom::models {

// What one forward pass is for. Dropout is on only when training; its masks are drawn from
// dropout_key, which the trainer derives from (seed, step, micro-batch), and each site folds in its
// layer and name, so masks do not depend on threads and repeat exactly after a resume.
// Activation recomputation (training.recompute): what a training forward keeps of each block for the
// backward. None: everything its ops save. Full: the block's input only; the backward runs the block
// again. Selective: the GEMMs' outputs (and the block's input); the backward runs again only the cheap
// ops between them: norms, activations, the attention core, residual adds (Korthikanti et al. 2022 keep
// the GEMM outputs and recompute attention's core). Same bits in every mode (autograd::checkpoint).
enum class Recompute { None, Full, Selective };
const char* recompute_name(Recompute r);
// "none", "full", "selective"; anything else throws naming the value.
Recompute recompute_from_name(const std::string& name);

struct ForwardContext {
  bool training = false;
  RngKey dropout_key;
  Recompute recompute = Recompute::None;
  // Packed rows (several documents per row, train/sft_data.h): i32 [B, T] positions restarting at 0 per
  // document, and key_begin, the first position of each position's document (attention is then
  // block-diagonal causal: ops::causal_self_attention). Undefined: one sequence per row from position 0.
  // Every family takes them (DeepSeek-V3 in MLA and its MTP modules too; not on a pipe axis).
  Tensor positions, key_begin;

  static ForwardContext train(RngKey key, Recompute recompute = Recompute::None) { return {true, key, recompute, {}, {}}; }
};

// One transformer block of a training forward under ctx.recompute: fn(inputs) directly (None, or no
// gradient wanted), else through autograd::checkpoint. The families call it for each layer.
TensorList recompute_block(const ForwardContext& ctx, const TensorList& inputs,
                           std::function<TensorList(const TensorList&)> fn);
Tensor recompute_block(const ForwardContext& ctx, const Tensor& x, std::function<Tensor(const Tensor&)> fn);

class LanguageModel : public nn::Module {
 public:
  explicit LanguageModel(ModelConfig config) : model_config_(std::move(config)) {}

  // The `model` section this model was built from (family, shapes, options).
  const ModelConfig& model_config() const { return model_config_; }
  const std::string& arch() const { return model_config_.arch(); }
  int64_t vocab_size() const { return model_config_.vocab_size(); }
  int64_t context_length() const { return model_config_.context_length(); }

  // ids: i32 [B, T], T <= context_length. Returns logits [B, T, V].
  virtual Tensor logits(const Tensor& ids, const ForwardContext& ctx = {}) const = 0;
  // Mean next-token cross-entropy of the logits of `ids` against targets i32 [B, T]; differentiable.
  virtual Tensor loss(const Tensor& ids, const Tensor& targets, const ForwardContext& ctx = {}) const = 0;

  // Incremental decoding, no autodiff: ids [B, t] follow the cache's contents; returns their logits
  // [B, t, V] and appends them to the cache.
  virtual std::unique_ptr<nn::DecodeCache> make_decode_cache(int64_t batch) const = 0;
  virtual Tensor decode(const Tensor& ids, nn::DecodeCache& cache) const = 0;
  // decode() that returns only the last position's logits [B, 1, V]: a prompt's prefill needs no
  // others, and the LM head over every position is a large part of it (SmolLM2: 28M of the ~120M
  // multiply-adds per token). The default slices decode()'s; a family may skip the other rows' head.
  virtual Tensor decode_last(const Tensor& ids, nn::DecodeCache& cache) const;

  // The model as nn/paged_decoder.h's decoder (Llama, GPT-2 and DeepSeek-V3 each describe themselves),
  // for batched serving with a paged KV cache; nullopt when it cannot be described now (a parameter
  // sharded over a mesh, a LoRA adapter, a weight type without kernels). The description shares the
  // model's tensors: it stays valid while the model lives and its layers do not change.
  virtual std::optional<nn::DecoderWeights> decoder_weights() const { return std::nullopt; }

  // The arithmetic of the model's GEMMs (f32, or bf16 operands with f32 accumulation and weights).
  virtual void set_matmul_precision(ops::MatmulPrecision precision) = 0;

  // Copies `values` into the parameter of that name; its shape must match (dtype is converted).
  void load_parameter(const std::string& name, const Tensor& values);
  // Total number of parameter elements.
  int64_t num_parameters();

  // ---- state besides the parameters, and the trainer's per-step hooks ------------------------------
  // Families without any keep the defaults (no state, hooks that do nothing).
  //
  // Named f32 tensors the model keeps besides its parameters (DeepSeek-V3's routing biases): no gradient
  // and no optimizer state, but saved with the parameters (model.safetensors, checkpoints) and restored
  // exactly. The tensors share the model's storage.
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const { return {}; }
  // Copies `values` into the state tensor of that name; its shape must match.
  void load_state(const std::string& name, const Tensor& values);
  // The trainer calls begin_training_step before a step's first micro-batch, and end_training_step once
  // the step is over: applied = the optimizer step was taken (false when it was skipped as non-finite).
  // Between them, loss() with ctx.training runs once per micro-batch. DeepSeek-V3 moves its routing
  // biases here, outside autodiff.
  virtual void begin_training_step() {}
  virtual void end_training_step(bool applied) { (void)applied; }
  // What the family measured over the training steps since the last call (e.g. the MTP loss, expert
  // loads), as a JSON object merged into metrics.jsonl's train events; resets the window.
  virtual nlohmann::json take_training_metrics() { return nlohmann::json::object(); }

  // ---- pipeline parallelism (parallel/pipeline.h) ----------------------------------------------------
  // How many blocks the pipe axis cuts between (stage boundaries fall between blocks); 0: the family
  // cannot run on a pipe axis.
  virtual int64_t pipeline_layers() const { return 0; }
  // One stage of a training forward: blocks [first, last). The first stage (first == 0) embeds `ids`; the
  // others continue from `x` [B, T, C], the previous stage's output. The last stage (last ==
  // pipeline_layers()) returns what loss(ids, targets, ctx) returns, the others their output [B, T, C].
  // Chained over the stages it is loss(): the same ops on the same values. A stage before the last whose
  // blocks add terms to the objective themselves (DeepSeek-V3's balance loss) sets *aux_loss to their sum
  // (a scalar the pipeline adds to the stage's objective); else it stays undefined.
  virtual Tensor stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids, const Tensor& targets,
                               const ForwardContext& ctx, Tensor* aux_loss) const;
  // Which ends of the pipeline use a parameter that belongs to no block (no "layers.<i>." prefix): 1 the
  // first stage, 2 the last, 3 both (a token table tied to the head). Default: the embedding and
  // position tables 1, everything else (final norm, head) 2.
  virtual int pipeline_ends(const nn::Parameter& p) const;

  // Backward writes the parameters' gradients: callers that may compute gradients of one model from
  // several threads (the Python module releases the GIL) hold this lock for forward + backward.
  std::mutex& backward_mutex() const { return backward_mutex_; }

 private:
  ModelConfig model_config_;
  mutable std::mutex backward_mutex_;
};

}  // namespace loom::models
