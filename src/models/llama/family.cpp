#include "models/llama/family.h"
#include "models/llama/names.h"

#include <nlohmann/json.hpp>

#include "models/config_fields.h"
#include "models/llama/hf.h"
#include "models/llama/gguf.h"
#include "models/llama/model.h"

namespace loom::llama {
using nlohmann::json;

namespace {

models::ModelStats stats_of(const json& j) {
  const Config c = Config::from_json(j);
  models::ModelStats s;
  s.description = str("vocab_size=", c.vocab_size, " context_length=", c.context_length, " d_model=", c.d_model,
                      " num_layers=", c.num_layers, " num_heads=", c.num_heads, " num_kv_heads=", c.kv_heads(),
                      " d_ff=", c.d_ff);
  s.total_params = c.total_params();
  s.lookup_params = c.embedding_params();
  s.matmul_params = c.non_embedding_params();  // the untied lm_head is a real matmul
  s.attention_width = c.d_model;
  s.num_layers = c.num_layers;
  s.context_length = c.context_length;
  s.chinchilla = models::chinchilla_forward({c.vocab_size, c.context_length, c.d_model, c.num_layers, c.num_heads,
                                             c.kv_heads(), c.head_dim(), c.d_ff, /*ffn_matrices=*/3});
  s.chinchilla_note = "dense block counted with SwiGLU's 3 matrices; the paper's MLP has 2";
  s.kv_cache_floats_per_token = 2 * c.num_layers * c.kv_heads() * c.head_dim();
  return s;
}

// Every key of the model section (a function's static, so no other static's constructor sees it unbuilt).
const models::ConfigFields<Config>& fields() {
  using models::Bound;
  static const models::ConfigFields<Config> f = {
      "llama",
      {
          {"vocab_size", &Config::vocab_size, Bound::Positive},
          {"context_length", &Config::context_length, Bound::Positive},
          {"d_model", &Config::d_model},  // with num_layers, num_heads, d_ff: positive, in validate()
          {"num_layers", &Config::num_layers},
          {"num_heads", &Config::num_heads},
          // Absent in files saved before grouped-query attention: the default 0 = num_heads.
          {"num_kv_heads", &Config::num_kv_heads, Bound::NonNegative, " (0 means the same as num_heads)"},
          {"d_ff", &Config::d_ff},
          {"rope_theta", &Config::rope_theta, Bound::Positive},
          {"norm_eps", &Config::norm_eps, Bound::Positive},
      },
      {
          {io::Relation::Divides, "num_heads", "d_model"},
          {io::Relation::Divides, "num_kv_heads", "num_heads", " (0 means the same as num_heads)", true},
      }};
  return f;
}

}  // namespace

void Config::validate() const {
  models::check_fields(fields(), *this);
  LOOM_CHECK(d_model > 0 && num_heads > 0 && num_layers > 0 && d_ff > 0, "model dimensions must be positive: d_model=",
             d_model, " num_heads=", num_heads, " num_layers=", num_layers, " d_ff=", d_ff);
  models::check_relations(fields(), *this);
  LOOM_CHECK(head_dim() % 2 == 0, "RoPE needs an even head dimension, got model.d_model=", d_model, " / model.num_heads=",
             num_heads, " = ", head_dim());
}

json Config::to_json() const { return models::fields_to_json(fields(), *this); }

Config Config::from_json(const json& j) { return models::fields_from_json(fields(), j); }

const models::Family& family() {
  static const models::Family f = models::family_of<Config, TransformerLM>({
      .arch = "llama",
      .summary = "Llama-style (CS336): RMSNorm, SwiGLU, RoPE, untied head, grouped-query attention",
      .relations = fields().relations,
      .stats = stats_of,
      .hf_model_type = "llama",
      .export_hf = export_hf,
      .import_hf = import_hf,
      .gguf_arch = "llama",
      .import_gguf = import_gguf,
      .export_gguf = export_gguf,
      .tensor_table = tensor_names,
  });
  return f;
}

}  // namespace loom::llama
