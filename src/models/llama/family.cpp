#include "models/llama/family.h"

#include <nlohmann/json.hpp>

#include "io/json_checked.h"

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

models::Family make_family() {
  models::Family f = models::family_of<Config, TransformerLM>(
      "llama", "Llama-style (CS336): RMSNorm, SwiGLU, RoPE, untied head, grouped-query attention");
  f.stats = stats_of;
  f.hf_model_type = "llama";
  f.export_hf = export_hf;
  f.import_hf = import_hf;
  f.gguf_arch = "llama";
  f.import_gguf = import_gguf;
  f.export_gguf = export_gguf;
  return f;
}

}  // namespace

json Config::to_json() const {
  return {{"arch", "llama"},
          {"vocab_size", vocab_size},
          {"context_length", context_length},
          {"d_model", d_model},
          {"num_layers", num_layers},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"d_ff", d_ff},
          {"rope_theta", io::float_for_json(rope_theta)},
          {"norm_eps", io::float_for_json(norm_eps)}};
}

Config Config::from_json(const json& j) {
  Config c;
  try {
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.context_length = j.at("context_length").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.num_kv_heads = j.value("num_kv_heads", int64_t{0});  // absent in files saved before GQA: 0 = num_heads
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.rope_theta = j.at("rope_theta").get<float>();
    c.norm_eps = j.at("norm_eps").get<float>();
  } catch (const json::exception& e) {
    LOOM_FAIL("malformed llama model config: ", e.what());
  }
  c.validate();
  LOOM_CHECK(c.norm_eps > 0, "model.norm_eps must be positive, got ", c.norm_eps);
  return c;
}

const models::Family& family() {
  static const models::Family f = make_family();
  return f;
}

}  // namespace loom::llama
