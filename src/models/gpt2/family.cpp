#include "models/gpt2/family.h"
#include "models/gpt2/names.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/config_fields.h"
#include "models/gpt2/gguf.h"
#include "models/gpt2/hf.h"
#include "models/gpt2/model.h"

namespace loom::gpt2 {
using nlohmann::json;

namespace {

models::ModelStats stats_of(const json& j) {
  const Config c = Config::from_json(j);
  models::ModelStats s;
  s.description = str("vocab_size=", c.vocab_size, " context_length=", c.context_length, " d_model=", c.d_model,
                      " num_layers=", c.num_layers, " num_heads=", c.num_heads, " d_ff=", c.ffn_dim(),
                      " tie_embeddings=", c.tie_embeddings ? "true" : "false",
                      " qkv_bias=", c.qkv_bias ? "true" : "false",
                      " output_proj_bias=", c.output_proj_bias ? "true" : "false");
  s.total_params = c.total_params();
  s.lookup_params = (c.vocab_size + c.context_length) * c.d_model;
  // The tied head multiplies by the embedding table: as a matmul it counts, once more.
  s.matmul_params = s.total_params - s.lookup_params + (c.tie_embeddings ? c.vocab_size * c.d_model : 0);
  s.attention_width = c.d_model;
  s.num_layers = c.num_layers;
  s.context_length = c.context_length;
  s.chinchilla = models::chinchilla_forward({c.vocab_size, c.context_length, c.d_model, c.num_layers, c.num_heads,
                                             c.num_heads, c.head_dim(), c.ffn_dim(), /*ffn_matrices=*/2});
  s.chinchilla_note = "the paper's terms exactly: a two-matrix MLP";
  s.kv_cache_floats_per_token = 2 * c.num_layers * c.d_model;
  return s;
}

// Every key of the model section (a function's static, so no other static's constructor sees it unbuilt).
const models::ConfigFields<Config>& fields() {
  using models::Bound;
  static const models::ConfigFields<Config> f = {
      "gpt2",
      {
          {"vocab_size", &Config::vocab_size, Bound::Positive},
          {"context_length", &Config::context_length, Bound::Positive},
          {"d_model", &Config::d_model},  // with num_layers, num_heads: positive, in validate()
          {"num_layers", &Config::num_layers},
          {"num_heads", &Config::num_heads},
          {"d_ff", &Config::d_ff, Bound::NonNegative, " (0 means 4 * d_model)"},
          {"norm_eps", &Config::norm_eps, Bound::Positive},
          {"qkv_bias", &Config::qkv_bias},
          {"output_proj_bias", &Config::output_proj_bias},
          {"tie_embeddings", &Config::tie_embeddings},
          {"dropout", &Config::dropout},  // in [0, 1): validate()
      },
      {
          {io::Relation::Divides, "num_heads", "d_model"},
      }};
  return f;
}

}  // namespace

void Config::validate() const {
  models::check_fields(fields(), *this);
  LOOM_CHECK(d_model > 0 && num_heads > 0 && num_layers > 0, "model dimensions must be positive: d_model=", d_model,
             " num_heads=", num_heads, " num_layers=", num_layers);
  models::check_relations(fields(), *this);
  LOOM_CHECK(dropout >= 0 && dropout < 1, "model.dropout must be in [0, 1), got ", dropout);
}

int64_t Config::params_per_layer() const {
  const int64_t C = d_model, F = ffn_dim();
  return 2 * C                                           // ln1
         + 3 * C * C + (qkv_bias ? 3 * C : 0)            // q, k, v
         + C * C + (output_proj_bias ? C : 0)            // output projection
         + 2 * C                                         // ln2
         + C * F + F + F * C + C;                        // fc, proj
}

int64_t Config::total_params() const {
  return (vocab_size + context_length) * d_model + num_layers * params_per_layer() + 2 * d_model +
         (tie_embeddings ? 0 : vocab_size * d_model);
}

json Config::to_json() const { return models::fields_to_json(fields(), *this); }

Config Config::from_json(const json& j) { return models::fields_from_json(fields(), j); }

const models::Family& family() {
  static const models::Family f = models::family_of<Config, GPT2>({
      .arch = "gpt2",
      .summary = "GPT-2: LayerNorm, GELU MLP, learned positions, biases, dropout, tied or untied head",
      .relations = fields().relations,
      .stats = stats_of,
      .hf_model_type = "gpt2",
      .export_hf = export_hf,
      .import_hf = import_hf,
      .gguf_arch = "gpt2",
      .import_gguf = import_gguf,
      .export_gguf = export_gguf,
      .tensor_table = tensor_names,
  });
  return f;
}

}  // namespace loom::gpt2
