// Reading a Llama config from a PyTorch fixture's "config" entry (written by the make_*.py scripts as
// [vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta]).
#pragma once

#include "models/llama/config.h"
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

}  // namespace loom::test
