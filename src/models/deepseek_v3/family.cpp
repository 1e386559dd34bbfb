#include "models/deepseek_v3/family.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_checked.h"
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

models::Family make_family() {
  models::Family f = models::family_of<Config, DeepSeekV3>(
      "deepseek_v3",
      "DeepSeek-V3: multi-head latent attention, routed MoE with aux-loss-free balancing, multi-token prediction");
  f.stats = stats_of;
  f.hf_model_type = "deepseek_v3";
  f.export_hf = export_hf;
  f.import_hf = import_hf;
  return f;
}

}  // namespace

void Config::validate() const {
  LOOM_CHECK(vocab_size > 0, "model.vocab_size must be positive, got ", vocab_size);
  LOOM_CHECK(context_length > 0, "model.context_length must be positive, got ", context_length);
  LOOM_CHECK(d_model > 0 && num_heads > 0 && num_layers > 0, "model dimensions must be positive: d_model=", d_model,
             " num_heads=", num_heads, " num_layers=", num_layers);
  LOOM_CHECK(n_dense >= 0 && n_dense <= num_layers, "model.n_dense=", n_dense, " must be in [0, model.num_layers=",
             num_layers, "]");
  LOOM_CHECK(q_rank > 0, "model.q_rank must be positive, got ", q_rank);
  LOOM_CHECK(kv_rank > 0, "model.kv_rank must be positive (the latent the cache holds), got ", kv_rank);
  LOOM_CHECK(d_nope > 0, "model.d_nope must be positive, got ", d_nope);
  LOOM_CHECK(d_rope > 0 && d_rope % 2 == 0, "model.d_rope must be positive and even (RoPE rotates pairs), got ",
             d_rope);
  LOOM_CHECK(d_v > 0, "model.d_v must be positive, got ", d_v);
  // Dense SwiGLUs run in the first n_dense layers and in every MTP module's block.
  LOOM_CHECK(d_ff > 0 || (n_dense == 0 && n_mtp == 0), "model.d_ff must be positive (model.n_dense=", n_dense,
             ", model.n_mtp=", n_mtp, " use dense SwiGLUs), got ", d_ff);
  LOOM_CHECK(d_ff >= 0, "model.d_ff must be >= 0, got ", d_ff);
  LOOM_CHECK(n_shared >= 0, "model.n_shared must be >= 0, got ", n_shared);
  LOOM_CHECK(n_routed >= 1, "model.n_routed must be >= 1, got ", n_routed);
  LOOM_CHECK(top_k >= 1 && top_k <= n_routed, "model.top_k=", top_k, " must be in [1, model.n_routed=", n_routed,
             "]");
  LOOM_CHECK(d_expert > 0, "model.d_expert must be positive, got ", d_expert);
  LOOM_CHECK(std::isfinite(route_scale) && route_scale > 0, "model.route_scale must be positive, got ", route_scale);
  LOOM_CHECK(std::isfinite(gamma) && gamma >= 0, "model.gamma must be >= 0, got ", gamma);
  LOOM_CHECK(std::isfinite(alpha_seq) && alpha_seq >= 0, "model.alpha_seq must be >= 0, got ", alpha_seq);
  LOOM_CHECK(n_mtp >= 0, "model.n_mtp must be >= 0, got ", n_mtp);
  LOOM_CHECK(n_mtp < context_length, "model.n_mtp=", n_mtp, " must be below model.context_length=", context_length,
             " (module k predicts k+1 tokens ahead)");
  LOOM_CHECK(std::isfinite(mtp_lambda) && mtp_lambda >= 0, "model.mtp_lambda must be >= 0, got ", mtp_lambda);
  LOOM_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "model.rope_theta must be positive, got ", rope_theta);
  LOOM_CHECK(std::isfinite(init_std) && init_std > 0, "model.init_std must be positive, got ", init_std);
  LOOM_CHECK(std::isfinite(norm_eps) && norm_eps > 0, "model.norm_eps must be positive, got ", norm_eps);
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

json Config::to_json() const {
  return {{"arch", "deepseek_v3"},
          {"vocab_size", vocab_size},
          {"context_length", context_length},
          {"d_model", d_model},
          {"num_layers", num_layers},
          {"n_dense", n_dense},
          {"num_heads", num_heads},
          {"q_rank", q_rank},
          {"kv_rank", kv_rank},
          {"d_nope", d_nope},
          {"d_rope", d_rope},
          {"d_v", d_v},
          {"d_ff", d_ff},
          {"n_shared", n_shared},
          {"n_routed", n_routed},
          {"top_k", top_k},
          {"d_expert", d_expert},
          {"route_scale", io::float_for_json(route_scale)},
          {"gamma", io::float_for_json(gamma)},
          {"alpha_seq", io::float_for_json(alpha_seq)},
          {"n_mtp", n_mtp},
          {"mtp_lambda", io::float_for_json(mtp_lambda)},
          {"rope_theta", io::float_for_json(rope_theta)},
          {"init_std", io::float_for_json(init_std)},
          {"norm_eps", io::float_for_json(norm_eps)}};
}

Config Config::from_json(const json& j) {
  Config c;
  try {
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.context_length = j.at("context_length").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.n_dense = j.at("n_dense").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.q_rank = j.at("q_rank").get<int64_t>();
    c.kv_rank = j.at("kv_rank").get<int64_t>();
    c.d_nope = j.at("d_nope").get<int64_t>();
    c.d_rope = j.at("d_rope").get<int64_t>();
    c.d_v = j.at("d_v").get<int64_t>();
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.n_shared = j.at("n_shared").get<int64_t>();
    c.n_routed = j.at("n_routed").get<int64_t>();
    c.top_k = j.at("top_k").get<int64_t>();
    c.d_expert = j.at("d_expert").get<int64_t>();
    c.route_scale = j.at("route_scale").get<float>();
    c.gamma = j.at("gamma").get<float>();
    c.alpha_seq = j.at("alpha_seq").get<float>();
    c.n_mtp = j.at("n_mtp").get<int64_t>();
    c.mtp_lambda = j.at("mtp_lambda").get<float>();
    c.rope_theta = j.at("rope_theta").get<float>();
    c.init_std = j.at("init_std").get<float>();
    c.norm_eps = j.at("norm_eps").get<float>();
  } catch (const json::exception& e) {
    LOOM_FAIL("malformed deepseek_v3 model config: ", e.what());
  }
  c.validate();
  return c;
}

const models::Family& family() {
  static const models::Family f = make_family();
  return f;
}

}  // namespace loom::deepseek_v3
