#include "io/json_checked.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

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

const char* relation_name(Relation r) {
  switch (r) {
    case Relation::Divides: return "divides";
    case Relation::AtMost: return "at_most";
    case Relation::Below: return "below";
  }
  return "?";
}

namespace {
const json& at_path(const json& values, const std::string& path) {
  const json* slot = &values;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    LOOM_CHECK(slot->is_object() && slot->contains(part), "config relation names ", path, ", which is not a key");
    slot = &(*slot)[part];
    if (dot == std::string::npos) return *slot;
    start = dot + 1;
  }
}
// As the one-key messages show numbers (1, not JSON's 1.0).
std::string show_number(const json& v) {
  if (!v.is_number_float()) return v.dump();
  std::ostringstream s;
  s << v.get<double>();
  return s.str();
}
}  // namespace

void check_relations(const json& values, const std::vector<KeyRelation>& relations, const std::string& prefix,
                     const char* lead) {
  for (const KeyRelation& r : relations) {
    const json& ja = at_path(values, r.a);
    const json& jb = at_path(values, r.b);
    LOOM_CHECK(ja.is_number() && jb.is_number(), "config relation between ", r.a, " and ", r.b, " needs numbers");
    const std::string a = prefix + r.a + "=" + show_number(ja), b = prefix + r.b + "=" + show_number(jb);
    if (r.zero_exempt && ja.get<double>() == 0) continue;
    switch (r.kind) {
      case Relation::Divides: {
        LOOM_CHECK(ja.is_number_integer() && jb.is_number_integer(), "config relation ", r.a, " divides ", r.b,
                   " needs integers");
        const int64_t x = ja.get<int64_t>(), y = jb.get<int64_t>();
        if (x <= 0) continue;  // the divisor's own bound says it
        LOOM_CHECK(y % x == 0, lead, b, " is not divisible by ", a, r.why);
        break;
      }
      case Relation::AtMost:
        LOOM_CHECK(ja.get<double>() <= jb.get<double>(), lead, a, " must be at most ", b, r.why);
        break;
      case Relation::Below:
        LOOM_CHECK(ja.get<double>() < jb.get<double>(), lead, a, " must be below ", b, r.why);
        break;
    }
  }
}

json relations_json(const std::vector<KeyRelation>& relations, const std::string& prefix) {
  json out = json::array();
  for (const KeyRelation& r : relations) {
    out.push_back({{"kind", relation_name(r.kind)}, {"a", prefix + r.a}, {"b", prefix + r.b},
                   {"zero_exempt", r.zero_exempt}});
  }
  return out;
}

}  // namespace loom::io
