#include "models/model_config.h"

#include "core/error.h"
#include "io/json.h"
#include "io/json_checked.h"
#include "models/family.h"
#include "models/model.h"

namespace loom::models {

ModelConfig::ModelConfig() : ModelConfig(from_json(nlohmann::json::object())) {}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  LOOM_CHECK(j.is_object(), "config: model must be a JSON object, got ", io::brief_json(j));
  std::string arch = "llama";
  if (j.contains("arch")) {
    LOOM_CHECK(j["arch"].is_string(), "config: model.arch must be a string, got ", io::brief_json(j["arch"]));
    arch = j["arch"].get<std::string>();
  }
  const Family& fam = models::family(arch);
  nlohmann::json values = fam.defaults;
  io::merge_checked(values, j, "model");
  fam.validate(values);
  return ModelConfig(arch, std::move(values));
}

const Family& ModelConfig::family() const { return models::family(arch_); }

ModelConfig ModelConfig::with(const std::string& key, const nlohmann::json& value) const {
  nlohmann::json j = values_;
  j[key] = value;
  return from_json(j);
}

std::unique_ptr<LanguageModel> ModelConfig::build(uint64_t seed) const { return family().build(*this, seed); }

ModelStats ModelConfig::stats() const { return family().stats(values_); }

}  // namespace loom::models
