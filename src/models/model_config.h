// The `model` section of a config: which family (`arch`) and that family's keys.
//
// It is kept as JSON, complete (every key of the family's defaults present) and validated by the
// family, so that code outside the family can carry, save and compare it without knowing the family,
// and a new family adds keys without touching this file. Every family has vocab_size and
// context_length, which the data loaders and the decoder need.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::models {

struct Family;
class LanguageModel;
struct ModelStats;

class ModelConfig {
 public:
  // The default family's defaults (llama).
  ModelConfig();
  // `j` may be partial: missing keys take the family's defaults (family = j["arch"], default "llama").
  // Unknown keys, wrong types and impossible values are errors naming "model.<key>".
  static ModelConfig from_json(const nlohmann::json& j);
  // The complete section, "arch" first.
  const nlohmann::json& json() const { return values_; }

  const std::string& arch() const { return arch_; }
  const Family& family() const;
  int64_t vocab_size() const { return values_.at("vocab_size").get<int64_t>(); }
  int64_t context_length() const { return values_.at("context_length").get<int64_t>(); }

  // A copy with `key` set to `value` (checked and validated as from_json does).
  ModelConfig with(const std::string& key, const nlohmann::json& value) const;

  // Builds the model, every parameter drawn from RngKey::from_seed(seed).fold_in(name).
  std::unique_ptr<LanguageModel> build(uint64_t seed) const;
  // Parameter counts and FLOPs per token (models/stats.h).
  ModelStats stats() const;

  bool operator==(const ModelConfig& other) const { return values_ == other.values_; }

 private:
  ModelConfig(std::string arch, nlohmann::json values) : arch_(std::move(arch)), values_(std::move(values)) {}
  std::string arch_;
  nlohmann::json values_;
};

}  // namespace loom::models
