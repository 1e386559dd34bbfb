#include "io/json_checked.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/json.h"

namespace loom::io {
using nlohmann::json;

namespace {

std::string join_keys(const json& obj) {
  std::string out;
  for (auto it = obj.begin(); it != obj.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out;
}

// Copies `value` into `slot` if it has the kind of the default already there; throws naming `path`.
void set_checked(json& slot, const json& value, const std::string& path) {
  if (slot.is_boolean()) {
    LOOM_CHECK(value.is_boolean(), "config: ", path, " must be true or false, got ", brief_json(value));
    slot = value;
  } else if (slot.is_number_unsigned()) {
    bool integral = value.is_number_integer() ||
                    (value.is_number_float() && std::isfinite(value.get<double>()) &&
                     std::floor(value.get<double>()) == value.get<double>() && value.get<double>() < 0x1p64);  // converting a larger double to uint64_t is undefined
    LOOM_CHECK(integral && value.get<double>() >= 0, "config: ", path, " must be a non-negative integer, got ",
               brief_json(value));
    slot = value.is_number_float() ? json(static_cast<uint64_t>(value.get<double>())) : json(value.get<uint64_t>());
  } else if (slot.is_number_integer()) {
    bool integral = value.is_number_integer() ||
                    (value.is_number_float() && std::isfinite(value.get<double>()) &&
                     std::floor(value.get<double>()) == value.get<double>() && std::fabs(value.get<double>()) < 9e18);
    LOOM_CHECK(integral, "config: ", path, " must be an integer, got ", brief_json(value));
    // 2^64-1 parses as an unsigned JSON number: read as int64_t it would wrap to -1, and the range check
    // after would report -1, a value the user never wrote.
    LOOM_CHECK(!value.is_number_unsigned() || value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), "config: ", path,
               " = ", brief_json(value), " is too large (at most ", INT64_MAX, ")");
    slot = value.is_number_float() ? json(static_cast<int64_t>(value.get<double>())) : json(value.get<int64_t>());
  } else if (slot.is_number()) {
    LOOM_CHECK(value.is_number(), "config: ", path, " must be a number, got ", brief_json(value));
    slot = value.get<double>();
  } else if (slot.is_string()) {
    LOOM_CHECK(value.is_string(), "config: ", path, " must be a string, got ", brief_json(value));
    slot = value;
  } else {
    LOOM_ASSERT(false, "config default for ", path, " has an unexpected JSON type");
  }
}

}  // namespace

double float_for_json(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

void merge_checked(json& base, const json& overlay, const std::string& prefix) {
  LOOM_CHECK(overlay.is_object(), "config: ", prefix.empty() ? "the configuration" : prefix,
             " must be a JSON object, got ", brief_json(overlay));
  for (auto it = overlay.begin(); it != overlay.end(); ++it) {
    std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (!base.contains(it.key())) {
      LOOM_FAIL("config: unknown key ", brief_text(path), " (", prefix.empty() ? "the top level" : prefix, " has: ",
                join_keys(base), ")");
    }
    json& slot = base[it.key()];
    if (slot.is_object()) {
      merge_checked(slot, it.value(), path);
    } else {
      set_checked(slot, it.value(), path);
    }
  }
}

}  // namespace loom::io
