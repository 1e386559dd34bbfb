#include "models/gpt2/family.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/json_checked.h"

#include "core/error.h"
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

models::Family make_family() {
  models::Family f = models::family_of<Config, GPT2>(
      "gpt2", "GPT-2: LayerNorm, GELU MLP, learned positions, biases, dropout, tied or untied head");
  f.stats = stats_of;
  f.hf_model_type = "gpt2";
  f.export_hf = export_hf;
  f.import_hf = import_hf;
  f.gguf_arch = "gpt2";
  f.import_gguf = import_gguf;
  f.export_gguf = export_gguf;
  return f;
}

}  // namespace

void Config::validate() const {
  LOOM_CHECK(vocab_size > 0, "model.vocab_size must be positive, got ", vocab_size);
  LOOM_CHECK(context_length > 0, "model.context_length must be positive, got ", context_length);
  LOOM_CHECK(d_model > 0 && num_heads > 0 && num_layers > 0, "model dimensions must be positive: d_model=", d_model,
             " num_heads=", num_heads, " num_layers=", num_layers);
  LOOM_CHECK(d_model % num_heads == 0, "model.d_model=", d_model, " is not divisible by model.num_heads=", num_heads);
  LOOM_CHECK(d_ff >= 0, "model.d_ff must be >= 0 (0 means 4 * d_model), got ", d_ff);
  LOOM_CHECK(norm_eps > 0, "model.norm_eps must be positive, got ", norm_eps);
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

json Config::to_json() const {
  return {{"arch", "gpt2"},
          {"vocab_size", vocab_size},
          {"context_length", context_length},
          {"d_model", d_model},
          {"num_layers", num_layers},
          {"num_heads", num_heads},
          {"d_ff", d_ff},
          {"norm_eps", io::float_for_json(norm_eps)},
          {"qkv_bias", qkv_bias},
          {"output_proj_bias", output_proj_bias},
          {"tie_embeddings", tie_embeddings},
          {"dropout", io::float_for_json(dropout)}};
}

Config Config::from_json(const json& j) {
  Config c;
  try {
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.context_length = j.at("context_length").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.norm_eps = j.at("norm_eps").get<float>();
    c.qkv_bias = j.at("qkv_bias").get<bool>();
    c.output_proj_bias = j.at("output_proj_bias").get<bool>();
    c.tie_embeddings = j.at("tie_embeddings").get<bool>();
    c.dropout = j.at("dropout").get<float>();
  } catch (const json::exception& e) {
    LOOM_FAIL("malformed gpt2 model config: ", e.what());
  }
  c.validate();
  return c;
}

const models::Family& family() {
  static const models::Family f = make_family();
  return f;
}

}  // namespace loom::gpt2
