// A family's model config as one list of fields, from which its `model` section is read and written
// (to_json; from_json with the struct's defaults for missing keys, type checks and unknown keys named,
// as io::merge_checked does for a whole config file) and its one-key bounds are checked, instead of code
// per key. The defaults stay where the struct declares them; the relations between keys (io::KeyRelation:
// num_heads divides d_model) are declared beside the fields and checked by check_relations; checks across
// keys that are not such a relation stay in validate().
//
//   const models::ConfigFields<Config> kFields = {"llama", {
//       {"vocab_size", &Config::vocab_size, models::Bound::Positive},
//       {"num_kv_heads", &Config::num_kv_heads, models::Bound::NonNegative, " (0 means num_heads)"}, ...}};
//   json Config::to_json() const { return models::fields_to_json(kFields, *this); }
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "io/json_checked.h"

namespace loom::models {

// What one field must be besides its type. Messages: "model.<key> must be positive<why>, got <value>";
// a float must also be finite.
enum class Bound { Any, Positive, NonNegative };

template <typename Config>
struct ConfigField {
  const char* key;
  std::variant<int64_t Config::*, float Config::*, bool Config::*> member;
  Bound bound = Bound::Any;
  const char* why = "";  // said after the bound: " (the latent the cache holds)"
};

template <typename Config>
struct ConfigFields {
  const char* arch;
  std::vector<ConfigField<Config>> fields;
  std::vector<io::KeyRelation> relations = {};  // between fields, keys without "model."
};

namespace detail {
// `j` merged into `values` (every key with its default) as io::merge_checked does under "model"; an
// "arch" other than `arch` is an error naming both.
void merge_model_section(nlohmann::json& values, const nlohmann::json& j, const char* arch);
void check_bound(const char* key, Bound bound, const char* why, int64_t value);
void check_bound(const char* key, Bound bound, const char* why, float value);
inline void check_bound(const char*, Bound, const char*, bool) {}
}  // namespace detail

// The `model` section: "arch" and every field (floats as their shortest decimal).
template <typename Config>
nlohmann::json fields_to_json(const ConfigFields<Config>& f, const Config& c) {
  nlohmann::json j = {{"arch", f.arch}};
  for (const ConfigField<Config>& field : f.fields) {
    std::visit(
        [&](auto member) {
          const auto& v = c.*member;
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, float>) {
            j[field.key] = io::float_for_json(v);
          } else {
            j[field.key] = v;
          }
        },
        field.member);
  }
  return j;
}

// A Config from a `model` section, complete or not (missing keys keep the struct's defaults), checked
// key by key and type by type, then validated.
template <typename Config>
Config fields_from_json(const ConfigFields<Config>& f, const nlohmann::json& j) {
  nlohmann::json values = fields_to_json(f, Config{});
  detail::merge_model_section(values, j, f.arch);
  Config c;
  for (const ConfigField<Config>& field : f.fields) {
    std::visit([&](auto member) { values[field.key].get_to(c.*member); }, field.member);
  }
  c.validate();
  return c;
}

// The one-key bounds, in list order (validate() calls it before its checks across keys).
template <typename Config>
void check_fields(const ConfigFields<Config>& f, const Config& c) {
  for (const ConfigField<Config>& field : f.fields) {
    std::visit([&](auto member) { detail::check_bound(field.key, field.bound, field.why, c.*member); }, field.member);
  }
}

// The declared relations between fields (validate() calls it once the one-key checks have passed):
// "model.d_model=64 is not divisible by model.num_heads=3".
template <typename Config>
void check_relations(const ConfigFields<Config>& f, const Config& c) {
  io::check_relations(fields_to_json(f, c), f.relations, "model.");
}

}  // namespace loom::models
