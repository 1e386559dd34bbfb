// Models built from PyTorch fixtures and the pieces of a model tests reach into:
//   * a Llama config from a fixture's "config" entry (written by the make_*.py scripts as
//     [vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta]);
//   * a family's variant from a fixture holding "<variant>.config_json" and "<variant>.init.<parameter>"
//     (tests/models/gpt2 and deepseek_v3), and the check that the model's parameters are those entries;
//   * every Linear of a Llama, the ones quantized kernels replace.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/llama/config.h"
#include "models/llama/model.h"
#include "models/model_config.h"
#include "support/op_test.h"

namespace loom::test {

inline llama::Config llama_config_from_fixture(const Fixture& f) {
  auto c = f.get("config").to_vector<float>();
  llama::Config cfg;
  cfg.vocab_size = static_cast<int64_t>(c[0]);
  cfg.context_length = static_cast<int64_t>(c[1]);
  cfg.d_model = static_cast<int64_t>(c[2]);
  cfg.num_layers = static_cast<int64_t>(c[3]);
  cfg.num_heads = static_cast<int64_t>(c[4]);
  cfg.d_ff = static_cast<int64_t>(c[5]);
  cfg.rope_theta = c[6];
  return cfg;
}

// The config of `variant`, read as a config file's model section of family `arch` would be.
template <typename Config>
Config family_config_from_fixture(const Fixture& f, const std::string& variant, const std::string& arch) {
  nlohmann::json j = f.raw(variant + ".config_json");
  j["arch"] = arch;
  return Config::from_json(models::ModelConfig::from_json(j).json());
}

// `model` with every parameter set to the fixture's "<variant>.init.<name>".
template <typename Model>
std::unique_ptr<Model> load_fixture_parameters(std::unique_ptr<Model> model, const Fixture& f, const std::string& variant) {
  for (nn::Parameter* p : model->parameters()) model->load_parameter(p->name, f.get(variant + ".init." + p->name));
  return model;
}

// Checks that `model`'s parameters are exactly the fixture's "<variant>.init.*" entries, shape for
// shape, and returns how many numbers they hold.
inline int64_t expect_fixture_parameters(models::LanguageModel& model, const Fixture& f, const std::string& variant) {
  size_t fixture_params = 0;
  for (const auto& [key, value] : f.raw_all().items()) {
    if (key.rfind(variant + ".init.", 0) == 0) ++fixture_params;
  }
  EXPECT_EQ(model.parameters().size(), fixture_params);
  int64_t total = 0;
  for (nn::Parameter* p : model.parameters()) {
    EXPECT_EQ(p->value.shape(), f.get(variant + ".init." + p->name).shape()) << p->name;
    total += p->value.numel();
  }
  return total;
}

// Every projection of every layer (q k v o w1 w2 w3), then the head.
inline std::vector<nn::Linear*> llama_linears(llama::TransformerLM& m) {
  std::vector<nn::Linear*> out;
  for (auto& layer : m.layers) {
    for (nn::Linear* l : {&layer->attn.q_proj, &layer->attn.k_proj, &layer->attn.v_proj, &layer->attn.output_proj,
                          &layer->ffn.w1, &layer->ffn.w2, &layer->ffn.w3}) {
      out.push_back(l);
    }
  }
  out.push_back(&m.lm_head);
  return out;
}

}  // namespace loom::test
