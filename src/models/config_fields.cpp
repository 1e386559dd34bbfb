#include "models/config_fields.h"

#include <cmath>

#include "core/error.h"
#include "io/json.h"

namespace loom::models::detail {

void merge_model_section(nlohmann::json& values, const nlohmann::json& j, const char* arch) {
  LOOM_CHECK(j.is_object(), "config: model must be a JSON object, got ", io::brief_json(j));
  if (j.contains("arch")) {
    LOOM_CHECK(j["arch"] == arch, "config: model.arch is ", io::brief_json(j["arch"]), ", but this is the \"", arch,
               "\" family's config");
  }
  io::merge_checked(values, j, "model");
}

namespace {
template <typename T>
void check(const char* key, Bound bound, const char* why, T value, bool finite) {
  if (bound == Bound::Positive) {
    LOOM_CHECK(finite && value > 0, "model.", key, " must be positive", why, ", got ", value);
  } else if (bound == Bound::NonNegative) {
    LOOM_CHECK(finite && value >= 0, "model.", key, " must be >= 0", why, ", got ", value);
  }
}
}  // namespace

void check_bound(const char* key, Bound bound, const char* why, int64_t value) { check(key, bound, why, value, true); }
void check_bound(const char* key, Bound bound, const char* why, float value) {
  check(key, bound, why, value, std::isfinite(value));
}

}  // namespace loom::models::detail
