// Merging user JSON into defaults, key by key and type by type: what config files and model sections
// are checked with. An unknown key lists the valid ones; a wrong type names the key and the value:
//   config: unknown key model.d_modle (model has: arch, vocab_size, context_length, ...)
//   config: optimizer.lr must be a number, got "abc"
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::io {

// Merges `overlay` into `base`, which holds every allowed key with a default of the right type
// (objects are merged recursively). `prefix` is the dotted path of `base` in messages ("" for the top).
void merge_checked(nlohmann::json& base, const nlohmann::json& overlay, const std::string& prefix);

// A float as the double with the float's shortest decimal form, so a JSON file says 1e-05 and not
// 9.99999974737875e-06; reading it back rounds to the same float.
double float_for_json(float f);

// A relation between two number keys of a config that each hold a valid value alone: declared as data
// beside the keys (a family's ConfigFields, TrainConfig's list), checked by check_relations, and listed
// by `loom options --json` ("config_relations"), from which tools/wrong_way.py makes one case per
// relation. Keys are dotted paths inside the JSON checked ("d_model", "optimizer.lr").
enum class Relation { Divides, AtMost, Below };
struct KeyRelation {
  Relation kind;
  const char* a;  // Divides: a divides b; AtMost: a <= b; Below: a < b
  const char* b;
  const char* why = "";         // said after the message: " (0 means the same as num_heads)"
  bool zero_exempt = false;     // a = 0 stands for "unset" and satisfies the relation
};
const char* relation_name(Relation r);  // "divides", "at_most", "below"

// Throws loom::Error naming both keys (`prefix` before them: "model.") and their values:
//   model.d_model=64 is not divisible by model.num_heads=3
//   optimizer.min_lr=0.01 must be at most optimizer.lr=0.003
// A Divides whose divisor is not positive is left to the key's own bound check.
// `lead` starts the message ("config: ").
void check_relations(const nlohmann::json& values, const std::vector<KeyRelation>& relations,
                     const std::string& prefix, const char* lead = "");
// [{"kind": "divides", "a": "<prefix>a", "b": "<prefix>b", "zero_exempt": false}, ...]
nlohmann::json relations_json(const std::vector<KeyRelation>& relations, const std::string& prefix);

}  // namespace loom::io
