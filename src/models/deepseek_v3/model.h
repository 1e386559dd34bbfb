// The DeepSeek-V3 language model (models/deepseek_v3/config.h has the architecture; mla.h the attention).
//
// Legend: B batch, T sequence, C d_model, F d_ff / d_expert, E routed experts, K top_k, V vocab.
// Parameter names (Linear weights [out, in]; the seed's [in, out] arrays transposed):
//   token_embeddings.weight [V, C]
//   layers.{i}.attn_norm.weight [C], layers.{i}.attn.* (mla.h), layers.{i}.ffn_norm.weight [C]
//   dense layers (i < n_dense):  layers.{i}.mlp.{w1,w3}.weight [F, C], layers.{i}.mlp.w2.weight [C, F]
//   MoE layers:  layers.{i}.moe.router.weight [E, C]
//                layers.{i}.moe.shared.{w1,w3}.weight [n_shared*d_expert, C], .w2.weight [C, n_shared*d_expert]
//                layers.{i}.moe.experts.{w1,w3} [E, d_expert, C], layers.{i}.moe.experts.w2 [E, C, d_expert]
//   mtp.{k}.norm_h.weight, mtp.{k}.norm_e.weight [C], mtp.{k}.proj.weight [C, 2C], mtp.{k}.block.* (dense)
//   ln_final.weight [C], lm_head.weight [V, C] (untied)
// Model state, not parameters (no gradient, no optimizer): layers.{i}.moe.bias f32 [E], the routing
// bias of aux-loss-free balancing.
// Initialisation (the seed): every matrix and the embedding normal(0, init_std), norm gains one, the
// routing biases zero.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "models/deepseek_v3/config.h"
#include "models/deepseek_v3/mla.h"
#include "models/model.h"
#include "nn/layers.h"

namespace loom::deepseek_v3 {

// What the MoE layers of one forward pass report besides their output.
struct RoutingRecord {
  Tensor balance_loss;             // sum over MoE layers of alpha_seq * sequence balance loss (scalar)
  std::vector<Tensor> expert_load; // per MoE layer: i32 [E] token slots routed to each expert
};

// DeepSeekMoE: shared experts (one SwiGLU of n_shared * d_expert) plus sparse routed experts.
// LoRA on the routed experts (nn::ExpertAdaptable): one adapter per expert of w1, w3 or w2, stacked
// (nn::LoRA with experts = E, named layers.{i}.moe.experts.w1.lora_A.weight [E, r, C] ...); the forward
// multiplies by the adapted stacks W + s B A (LoRA::adapted), so merging them gives the same function.
class MoE : public nn::Module, public nn::ExpertAdaptable {
 public:
  MoE(const std::string& name, const Config& c, RngKey key);
  // x: [B, T, C] -> [B, T, C]; adds this layer's balance loss and load to `record` when given.
  Tensor forward(const Tensor& x, RoutingRecord* record) const;
  int64_t top_k;
  float route_scale, alpha_seq;
  nn::Linear router;                 // kept f32 whatever the matmul precision (the seed routes in f32)
  std::unique_ptr<nn::SwiGLU> shared;  // null when n_shared = 0
  nn::Parameter& w1;                 // [E, F, C]
  nn::Parameter& w3;                 // [E, F, C]
  nn::Parameter& w2;                 // [E, C, F]
  Tensor bias;                       // f32 [E], model state
  std::string bias_name;             // layers.{i}.moe.bias
  ops::MatmulPrecision precision = ops::MatmulPrecision::F32;

  std::vector<nn::Parameter*> expert_weights() override { return {&w1, &w3, &w2}; }
  nn::LoRA* expert_lora(const nn::Parameter& weight) override { return slot(weight).get(); }
  nn::LoRA& attach_expert_lora(const nn::Parameter& weight, const nn::LoraOptions& options, RngKey key) override;
  std::unique_ptr<nn::LoRA> detach_expert_lora(const nn::Parameter& weight) override;

 private:
  std::unique_ptr<nn::LoRA>& slot(const nn::Parameter& weight);
  const nn::LoRA* lora_of(const nn::Parameter& weight) const { return const_cast<MoE*>(this)->slot(weight).get(); }
  std::unique_ptr<nn::LoRA> lora_w1_, lora_w3_, lora_w2_;  // attach_expert_lora's, or null
};

// Pre-norm block: h = x + attn(attn_norm(x)); y = h + ffn(ffn_norm(h)), ffn a dense SwiGLU or MoE.
class Block : public nn::Module {
 public:
  Block(const std::string& name, const Config& c, RngKey key, bool moe);
  // positions: i32 [T], or [B, T] with key_begin [B, T] for packed rows (MultiHeadLatentAttention::forward).
  Tensor forward(const Tensor& x, const Tensor& positions, RoutingRecord* record, const Tensor& key_begin = Tensor()) const;
  Tensor forward_cached(const Tensor& x, const Tensor& positions, LatentCache& cache, int64_t layer) const;
  nn::RMSNorm attn_norm;
  MultiHeadLatentAttention attn;
  nn::RMSNorm ffn_norm;
  std::unique_ptr<nn::SwiGLU> mlp;  // dense layers
  std::unique_ptr<MoE> moe;         // MoE layers
};

// Multi-token prediction module k: h' = block(proj([norm_h(h) ; norm_e(embed(token i+k))])).
class MtpModule : public nn::Module {
 public:
  MtpModule(const std::string& name, const Config& c, RngKey key);
  nn::RMSNorm norm_h, norm_e;
  nn::Linear proj;  // [C, 2C]
  Block block;      // dense
};

class DeepSeekV3 : public models::LanguageModel {
 public:
  DeepSeekV3(const Config& config, uint64_t seed);

  // The training objective's parts for ids and targets i32 [B, T] (targets[t] = the token after ids[t]):
  //   main    mean next-token cross-entropy;
  //   mtp     mean over the n_mtp modules of module k's cross-entropy predicting targets[t + k] at
  //           positions t < T - k (the seed feeds T + 1 + n_mtp tokens and scores T positions per
  //           module; loom's batches carry T + 1, so module k scores the T - k positions it can);
  //   balance sum over MoE layers of alpha_seq * the sequence balance loss;
  // Packed rows (ctx.positions and ctx.key_begin, fine-tuning's data.packing): attention stays within each
  // document, positions restart per document, and module k scores position t only when t + k is in t's
  // document (as running the documents one by one does). The balance loss and the expert loads count a
  // row's positions as one sequence, as they count a padded row's padding.
  //   total   main + mtp_lambda * mtp + balance (the seed's loss_fn).
  struct Losses {
    Tensor total, main, mtp, balance;
    std::vector<Tensor> expert_load;  // per MoE layer, i32 [E]
  };
  Losses losses(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx = {}) const;
  Tensor head_bf16_copy() const;  // lm_head's bf16 weight copy under bf16 precision (unsharded, CPU), else undefined

  // The last layer's output before ln_final [B, T, C].
  // Each layer under ctx.recompute (models::recompute_block).
  Tensor trunk(const Tensor& ids, const Tensor& positions, RoutingRecord* record,
               const models::ForwardContext& ctx = {}) const;
  // Blocks [first, last) on x [B, T, C]: trunk() is blocks(embedding, 0, num_layers).
  Tensor blocks(Tensor x, int64_t first, int64_t last, const Tensor& positions, RoutingRecord* record,
                const models::ForwardContext& ctx) const;

  Tensor logits(const Tensor& ids, const models::ForwardContext& ctx = {}) const override;
  // Training (ctx.training): losses().total, the objective the optimizer follows. Evaluation: the main
  // next-token cross-entropy only, comparable with other families.
  Tensor loss(const Tensor& ids, const Tensor& targets, const models::ForwardContext& ctx = {}) const override;
  // Decoding from the latent cache, in the absorbed form.
  std::unique_ptr<nn::DecodeCache> make_decode_cache(int64_t batch) const override;
  // `absorbed` false: the naive form that rebuilds per-head keys and values (tests compare the two).
  std::unique_ptr<LatentCache> make_latent_cache(int64_t batch, bool absorbed) const;
  Tensor decode(const Tensor& ids, nn::DecodeCache& cache) const override;
  // Batched serving's description: MLA in the absorbed form over a paged latent cache, dense and MoE layers.
  std::optional<nn::DecoderWeights> decoder_weights() const override;
  void set_matmul_precision(ops::MatmulPrecision precision) override;
  // The pipe axis: a stage runs its blocks (the first also the embedding; the last ln_final, the head,
  // the MTP modules, which read the token table too: tied over the first and last stage). The expert
  // loads of a stage's MoE layers are counted at their place among all MoE layers, and end_training_step
  // sums them over the stages too, so every rank moves every routing bias as one process does.
  int64_t pipeline_layers() const override { return config_.num_layers; }
  Tensor stage_forward(int64_t first, int64_t last, const Tensor& x, const Tensor& ids, const Tensor& targets,
                       const models::ForwardContext& ctx, Tensor* aux_loss) const override;
  int pipeline_ends(const nn::Parameter& p) const override;

  // The routing biases, layers.{i}.moe.bias.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  // Aux-loss-free balancing, after each applied optimizer step: per MoE layer, with load_i the token
  // slots expert i received over the step's micro-batches (on a mesh: summed over the ranks that split
  // the batch, so every rank applies the update of the global batch),
  //   bias_i += gamma * sign(mean load - load_i)
  // (the seed's update_bias; the sign is taken on integer counts, so it is exact).
  void begin_training_step() override;
  void end_training_step(bool applied) override;
  // Since the last call, over the training micro-batches: main_loss, mtp_loss, balance_loss (means),
  // expert_load_min / expert_load_max (per MoE layer: the least and most loaded expert's share of the
  // routed slots; 1/n_routed is even), and bias_min / bias_max (per MoE layer, now).
  nlohmann::json take_training_metrics() override;

  const Config& config() const { return config_; }
  // The MoE layers (in layer order).
  std::vector<MoE*> moe_layers() const;

  Config config_;
  nn::Embedding token_embeddings;
  std::vector<std::unique_ptr<Block>> layers;
  std::vector<std::unique_ptr<MtpModule>> mtp;
  nn::RMSNorm ln_final;
  nn::Linear lm_head;

 private:
  Tensor positions(int64_t start, int64_t t) const;
  // The mesh this model is sharded over (dist::shard_model), or null for one process.
  const dist::RankContext* rank_context() const;
  // What training forward passes measured (loss() with ctx.training), for the hooks above.
  void record_training(const Losses& l) const;
  // main, mtp and total from the trunk's output h and the trunk's record (losses() after trunk()).
  // packed_positions and key_begin: packed rows' (ForwardContext), else undefined.
  Losses head_losses(Tensor h, const Tensor& ids, const Tensor& targets, RoutingRecord& record,
                     const Tensor& packed_positions = Tensor(), const Tensor& key_begin = Tensor()) const;
  // The trunk's positions: packed rows' [B, T] when ctx has them (checked against ids), else 0..T-1.
  Tensor positions_of(const Tensor& ids, const models::ForwardContext& ctx) const;
  // The metrics' losses only (a pipeline's last stage), and one stage's expert loads, its first MoE layer
  // being MoE layer `offset`.
  void record_window(const Losses& l) const;
  void record_stage_loads(const std::vector<Tensor>& loads, size_t offset) const;
  mutable std::mutex training_mutex_;
  mutable std::vector<std::vector<int64_t>> step_load_;    // per MoE layer [E], this step
  mutable std::vector<std::vector<int64_t>> window_load_;  // per MoE layer [E], since the last metrics
  mutable double window_main_ = 0, window_mtp_ = 0, window_balance_ = 0;
  mutable int64_t window_batches_ = 0;
  Tensor positions_;  // i32 [context_length] = 0..context_length-1
};

}  // namespace loom::deepseek_v3
