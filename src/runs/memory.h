// Memory a job will need, estimated from its configuration before anything is allocated, and the check
// that refuses a job the machine cannot hold: a model of a million layers, a 1e9-token context or 1e9
// validation batches is an error naming the keys that drive it and the estimate in GiB, in
// milliseconds, instead of a std::bad_alloc (or the OOM killer) after minutes of allocating.
//
// The estimate, in bytes, all values f32 (4 bytes) unless said:
//   parameters        P·4, P = the family's stats().total_params, never less than the double-precision
//                     lower bound vocab_size·d_model + num_layers·2·d_model²; above 1e15 parameters the
//                     bound alone (the families count in int64, which such a model could overflow)
//   position tables   context_length·8 (position ids and the like, built with the model)
//   gradients         P·4                       (training)
//   AdamW moments     P·8                       (training)
//   bf16 copies       P·2                       (training.precision = bf16)
//   activations       B·T·d_model·num_layers·kActivationValues·4 for training (kept for backward);
//                     B·T·d_model·kActivationValues·4 for a forward pass without gradients (one layer's
//                     worth alive at a time). kActivationValues = 24 values per token, layer and unit of
//                     width: `loom bench train` peak RSS on a Llama with d_ff = 2.75·d_model grows by 79
//                     bytes (20 values) per token·layer·d_model; 24 leaves room for GPT-2's 4·d_model MLP
//                     and the caching allocator's slack.
//   loss chunk        512·vocab_size·8 (the fused LM head's logits and their gradient, 512 rows at a time)
//   batches           B·T·8 per batch (i32 inputs and targets), validation: eval.batches of them
//   KV cache          batch·kv_cache_floats_per_token·context_length·4 (decoding allocates it whole)
//   runtime           64 MiB (code, oneDNN, OpenMP, allocator; `bench train` on a tiny model peaks at 51)
// Token files are memory-mapped and not counted (the kernel can drop their pages).
//
// The budget is MemAvailable from /proc/meminfo (what can be had without swapping), or less when a
// cgroup (v2 memory.max) limits the process; `--max-memory SIZE` sets it explicitly, e.g. when the
// estimate is too cautious for a job the user knows fits.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/model_config.h"

namespace loom::runs {

// One term of an estimate: what it is, the keys (with values) that drive it, and its size.
struct MemoryTerm {
  std::string what;
  std::string keys;
  double bytes = 0;
};

struct MemoryEstimate {
  std::vector<MemoryTerm> terms;
  void add(std::string what, std::string keys, double bytes);
  void add(const MemoryEstimate& other);
  double total_bytes() const;
  // "parameters 1.2 GiB (model.num_layers=1000000 ...), activations ..." largest first.
  std::string describe() const;
};

// The model's weights and the tables built with it.
MemoryEstimate model_memory(const models::ModelConfig& model);
// Training steps of `batch_size` sequences (`batch_key` names the setting, "training.batch_size" or
// "--batch"): weights, gradients, AdamW moments, activations, the loss chunk, the batch.
MemoryEstimate training_step_memory(const models::ModelConfig& model, int64_t batch_size, bool bf16,
                                    const std::string& batch_key = "training.batch_size");
// Forward passes without gradients over `batch` windows of `context` tokens (0: the model's context),
// as `loom eval` runs them; logits_rows > 0 adds full logits [logits_rows, V] (eval --logits-out).
MemoryEstimate inference_memory(const models::ModelConfig& model, int64_t batch, int64_t context = 0,
                                int64_t logits_rows = 0);
// The KV cache of `batch` sequences of the full context, alone.
MemoryEstimate kv_cache_memory(const models::ModelConfig& model, int64_t batch);
// Decoding `batch` sequences: weights and the KV cache of the full context.
MemoryEstimate generation_memory(const models::ModelConfig& model, int64_t batch = 1);
// What a caller will do with a model it loads, as an estimate from the model's config: loading a weights
// file checks it before building the model (runs/load.h), so an absurd config in a file's metadata is
// refused for the whole job (a KV cache of its context, say) before anything is allocated.
using ModelJobMemory = std::function<MemoryEstimate(const models::ModelConfig&)>;

// Importing a Hugging Face directory, from config.json's shape keys (hidden_size/n_embd,
// num_hidden_layers/n_layer, intermediate_size/n_inner, vocab_size, max_position_embeddings/n_positions:
// 2·V·d + L·(4·d² + 3·d·F) + T·d parameters, an upper bound for the families loom reads) and the
// safetensors headers (the tensors' sizes, read without their data).
MemoryEstimate hf_import_memory(const std::string& dir);

// What a training forward keeps for the backward, per token, in values (4 bytes each in f32), as loom's
// ops save them, under activation recomputation (models::Recompute) with heads and d_ff split over
// `tensor` ranks. The planner (src/plan) and tests/train/recompute_test read it; one formula, here.
//   per_layer   kept by each transformer layer until its backward (its input included);
//   head        kept outside the layers: the last layer's output, ln_final's output and statistics, and
//               the fused LM head's gradient with respect to its input (3C + 1; GPT-2's LayerNorm + 1);
//   recompute   alive in addition while one layer is recomputed and differentiated (full, selective:
//               that layer's stored values come back for its backward).
// Llama (C d_model, K = num_kv_heads·head_dim, F d_ff, H heads, t tensor):
//   none       x, rstd, ln1(x), q, k, v, attention out, lse, h, rstd, ln2(h), w1 x, w3 x, swiglu out
//              = 4C + 3 + (2C + 2K + H + 3F)/t (one value more per token than these terms, measured)
//   selective  x and the GEMMs' outputs: q, k, v, output_proj, w1, w3, w2 = 3C + (C + 2K + 2F)/t
//   full       x = C
// Under tensor parallelism (t > 1) Megatron's f (ops::copy_to_group) gives each column-parallel Linear its
//   own copy of its input, and the Linear keeps that copy: ln1's output three times (q, k, v) and ln2's
//   twice (w1, w3) in Llama, +3C; +2C in GPT-2 (q, k, v); in DeepSeek-V3 the latents' and the MoE's.
// GPT-2 (LayerNorm keeps mean and rstd; F = the MLP's width): none = 4C + 4 + (2C + 2C + H + 2F)/t;
//   selective = 2C + (3C + F)/t; full = C.
// DeepSeek-V3 (MLA with q_rank Q, kv_rank R, RoPE width P, H heads of d_nope N and d_v Dv; dense SwiGLU
//   layers as Llama's, MoE layers: router logits, top_k slots' w1 x, w3 x, swiglu out of d_expert each,
//   shared experts as a SwiGLU of n_shared·d_expert): the layers' mean, term by term in memory.cpp.
struct ActivationModel {
  double per_layer = 0;
  double head = 0;
  double recompute = 0;
  std::string terms;  // the per-layer terms, in words
};
ActivationModel activation_model(const models::ModelConfig& model, models::Recompute recompute, int64_t tensor = 1);
// Bytes the activations of `tokens` tokens through `layers` layers keep (f32).
double kept_activation_bytes(const ActivationModel& a, double tokens, int64_t layers);
// The allocator's peak over one micro-batch's forward and backward, above what was in use before it and
// with no gradients yet: the kept activations plus the larger of the loss's forward (512 rows of logits and
// their gradient, beside the head's input gradient) and the backward's (every parameter's gradient,
// `grad_bytes`, and one layer's recomputed values).
// The loss's forward alone: 512 rows of logits and their gradient, and the head's input gradient.
double loss_forward_bytes(const models::ModelConfig& model, double tokens, int64_t tensor = 1);
double step_peak_bytes(const ActivationModel& a, const models::ModelConfig& model, double tokens, int64_t layers,
                       double grad_bytes);

// How much memory a job may use, and where the number comes from (for the error message).
struct MemoryBudget {
  double bytes = 0;
  std::string source;
  // MemAvailable, capped by the cgroup's memory.max minus memory.current; unlimited when neither can be
  // read (not Linux).
  static MemoryBudget of_machine();
  // A size: bytes, or a number with K, M, G or T (powers of 1024; "GiB", "GB", "G" alike), e.g. "8G",
  // "512MiB", "1.5GiB". `what` names the setting in errors and in `source`.
  static MemoryBudget parse(const std::string& size, const std::string& what = "--max-memory");
  // parse(setting) when the setting is given, else of_machine().
  static MemoryBudget from_setting(const std::string& setting, const std::string& what = "--max-memory");
};

// Throws loom::Error when the estimate exceeds the budget, naming the job, the estimate and the budget
// in GiB, and the terms with the keys that drive them.
void check_memory(const MemoryEstimate& estimate, const MemoryBudget& budget, const std::string& job);

// Bytes as "12.3 GiB" (or MiB below 1 GiB).
std::string format_bytes(double bytes);

}  // namespace loom::runs
