#include "models/deepseek_v3/family.h"
#include "models/deepseek_v3/names.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/config_fields.h"
#include "models/deepseek_v3/hf.h"
#include "models/deepseek_v3/model.h"

namespace loom::deepseek_v3 {
using nlohmann::json;

namespace {

models::ModelStats stats_of(const json& j) {
  const Config c = Config::from_json(j);
  models::ModelStats s;
  s.description = str("vocab_size=", c.vocab_size, " context_length=", c.context_length, " d_model=", c.d_model,
                      " num_layers=", c.num_layers, " (", c.n_dense, " dense) num_heads=", c.num_heads,
                      " q_rank=", c.q_rank, " kv_rank=", c.kv_rank, " d_nope=", c.d_nope, " d_rope=", c.d_rope,
                      " d_v=", c.d_v, " d_ff=", c.d_ff, " experts=", c.n_shared, " shared + ", c.n_routed,
                      " routed (top ", c.top_k, ", d_expert=", c.d_expert, ") n_mtp=", c.n_mtp);
  s.total_params = c.total_params();
  s.active_params = c.active_params();
  s.lookup_params = c.vocab_size * c.d_model;
  // The FLOPs follow what a token multiplies with: the active parameters (the untied head included).
  s.matmul_params = s.active_params;
  // PaLM's attention term counts q.k and p.v at one width H*D; MLA's differ (H*(d_nope+d_rope) and
  // H*d_v), so their mean stands for both.
  s.attention_width = c.num_heads * (c.qk_head_dim() + c.d_v) / 2;
  // The training step also runs the MTP modules (losses()): each its projection and dense block, and
  // the shared head again, on T - k positions. They are model FLOPs of the objective the step trains
  // (not recomputation), so MFU counts them (docs/moe.md, "What MFU counts").
  s.training_modules = c.n_mtp;
  s.training_module_matmul_params = c.mtp_module_params() + c.vocab_size * c.d_model;
  s.num_layers = c.num_layers;
  s.context_length = c.context_length;

  // Chinchilla's terms, with MLA's projections and the layers' mean feed-forward.
  const double T = static_cast<double>(c.context_length), V = static_cast<double>(c.vocab_size);
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.num_heads);
  const double L = static_cast<double>(c.num_layers);
  models::ChinchillaForward f;
  f.embeddings = 2 * T * V * d;
  f.attention_qkv = 2 * T *
                    static_cast<double>(c.d_model * c.q_rank + c.q_rank * c.num_heads * c.qk_head_dim() +
                                        c.d_model * (c.kv_rank + c.d_rope) +
                                        c.kv_rank * c.num_heads * (c.d_nope + c.d_v));
  f.attention_logits = 2 * T * T * H * static_cast<double>(c.qk_head_dim());
  f.attention_softmax = 3 * H * T * T;
  f.attention_reduce = 2 * T * T * H * static_cast<double>(c.d_v);
  f.attention_project = 2 * T * H * static_cast<double>(c.d_v) * d;
  const double dense_layer = 3 * d * static_cast<double>(c.d_ff);
  const double moe_layer = d * static_cast<double>(c.n_routed) +
                           3 * d * static_cast<double>((c.n_shared + c.top_k) * c.d_expert);
  f.dense = 2 * T * (static_cast<double>(c.n_dense) * dense_layer + static_cast<double>(c.num_moe_layers()) * moe_layer) / L;
  f.logits = 2 * T * d * V;
  f.num_layers = c.num_layers;
  f.context_length = c.context_length;
  s.chinchilla = f;
  s.chinchilla_note =
      "MLA's five projections as qkv; dense = the layers' mean of dense SwiGLU and active MoE (router, shared "
      "and top_k routed experts); the training-only MTP modules not counted";
  s.kv_cache_floats_per_token = c.num_layers * c.latent_cache_floats_per_layer();
  s.kv_cache_note = str("MLA latent c (", c.kv_rank, ") + shared RoPE key (", c.d_rope, ") = ",
                        c.latent_cache_floats_per_layer(), " per layer, against ",
                        c.num_heads * (c.qk_head_dim() + c.d_v), " for per-head keys and values");
  return s;
}

// Every key of the model section (a function's static, so no other static's constructor sees it unbuilt).
const models::ConfigFields<Config>& fields() {
  using models::Bound;
  static const models::ConfigFields<Config> f = {
      "deepseek_v3",
      {
          {"vocab_size", &Config::vocab_size, Bound::Positive},
          {"context_length", &Config::context_length, Bound::Positive},
          {"d_model", &Config::d_model},  // with num_layers, num_heads: positive, in validate()
          {"num_layers", &Config::num_layers},
          {"n_dense", &Config::n_dense, Bound::NonNegative},  // at most num_layers: a relation
          {"num_heads", &Config::num_heads},
          {"q_rank", &Config::q_rank, Bound::Positive},
          {"kv_rank", &Config::kv_rank, Bound::Positive, " (the latent the cache holds)"},
          {"d_nope", &Config::d_nope, Bound::Positive},
          {"d_rope", &Config::d_rope},  // positive and even: validate()
          {"d_v", &Config::d_v, Bound::Positive},
          {"d_ff", &Config::d_ff, Bound::NonNegative},  // positive with dense SwiGLUs: validate()
          {"n_shared", &Config::n_shared, Bound::NonNegative},
          {"n_routed", &Config::n_routed},  // >= 1: validate()
          {"top_k", &Config::top_k, Bound::Positive},  // at most n_routed: a relation
          {"d_expert", &Config::d_expert, Bound::Positive},
          {"route_scale", &Config::route_scale, Bound::Positive},
          {"gamma", &Config::gamma, Bound::NonNegative},
          {"alpha_seq", &Config::alpha_seq, Bound::NonNegative},
          {"n_mtp", &Config::n_mtp, Bound::NonNegative},
          {"mtp_lambda", &Config::mtp_lambda, Bound::NonNegative},
          {"rope_theta", &Config::rope_theta, Bound::Positive},
          {"init_std", &Config::init_std, Bound::Positive},
          {"norm_eps", &Config::norm_eps, Bound::Positive},
      },
      {
          {io::Relation::AtMost, "n_dense", "num_layers"},
          {io::Relation::AtMost, "top_k", "n_routed"},
          {io::Relation::Below, "n_mtp", "context_length", " (module k predicts k+1 tokens ahead)"},
      }};
  return f;
}

}  // namespace

void Config::validate() const {
  models::check_fields(fields(), *this);
  LOOM_CHECK(d_model > 0 && num_heads > 0 && num_layers > 0, "model dimensions must be positive: d_model=", d_model,
             " num_heads=", num_heads, " num_layers=", num_layers);
  LOOM_CHECK(d_rope > 0 && d_rope % 2 == 0, "model.d_rope must be positive and even (RoPE rotates pairs), got ",
             d_rope);
  // Dense SwiGLUs run in the first n_dense layers and in every MTP module's block.
  LOOM_CHECK(d_ff > 0 || (n_dense == 0 && n_mtp == 0), "model.d_ff must be positive (model.n_dense=", n_dense,
             ", model.n_mtp=", n_mtp, " use dense SwiGLUs), got ", d_ff);
  LOOM_CHECK(n_routed >= 1, "model.n_routed must be >= 1, got ", n_routed);
  models::check_relations(fields(), *this);
}

int64_t Config::attention_params() const {
  const int64_t C = d_model, H = num_heads;
  return C * q_rank + q_rank                        // wq_a, q_norm
         + q_rank * H * qk_head_dim()               // wq_b
         + C * (kv_rank + d_rope) + kv_rank         // wkv_a, kv_norm
         + kv_rank * H * (d_nope + d_v)             // wkv_b
         + H * d_v * C;                             // wo
}

int64_t Config::dense_block_params() const { return attention_params() + 2 * d_model + 3 * d_model * d_ff; }

int64_t Config::routed_expert_params() const { return 3 * d_model * d_expert; }

int64_t Config::moe_block_params() const {
  return attention_params() + 2 * d_model + d_model * n_routed   // router
         + 3 * d_model * n_shared * d_expert                       // shared experts, one SwiGLU
         + n_routed * routed_expert_params();
}

int64_t Config::mtp_module_params() const { return 2 * d_model + 2 * d_model * d_model + dense_block_params(); }

int64_t Config::total_params() const {
  return 2 * vocab_size * d_model + d_model  // embedding, head, final norm
         + n_dense * dense_block_params() + num_moe_layers() * moe_block_params() + n_mtp * mtp_module_params();
}

int64_t Config::active_params() const {
  return total_params() - vocab_size * d_model - n_mtp * mtp_module_params() -
         num_moe_layers() * (n_routed - top_k) * routed_expert_params();
}

json Config::to_json() const { return models::fields_to_json(fields(), *this); }

Config Config::from_json(const json& j) { return models::fields_from_json(fields(), j); }

const models::Family& family() {
  static const models::Family f = models::family_of<Config, DeepSeekV3>({
      .arch = "deepseek_v3",
      .summary = "DeepSeek-V3: multi-head latent attention, routed MoE with aux-loss-free balancing, multi-token "
                 "prediction",
      .relations = fields().relations,
      .stats = stats_of,
      .hf_model_type = "deepseek_v3",
      .export_hf = export_hf,
      .import_hf = import_hf,
      .tensor_table = tensor_names,
  });
  return f;
}

}  // namespace loom::deepseek_v3
