// Merging user JSON into defaults, key by key and type by type: what config files and model sections
// are checked with. An unknown key lists the valid ones; a wrong type names the key and the value:
//   config: unknown key model.d_modle (model has: arch, vocab_size, context_length, ...)
//   config: optimizer.lr must be a number, got "abc"
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace loom::io {

// Merges `overlay` into `base`, which holds every allowed key with a default of the right type
// (objects are merged recursively). `prefix` is the dotted path of `base` in messages ("" for the top).
void merge_checked(nlohmann::json& base, const nlohmann::json& overlay, const std::string& prefix);

// A float as the double with the float's shortest decimal form, so a JSON file says 1e-05 and not
// 9.99999974737875e-06; reading it back rounds to the same float.
double float_for_json(float f);

}  // namespace loom::io
