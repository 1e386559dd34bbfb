#include "report/inspect.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "io/json.h"
#include "models/model_config.h"
#include "models/stats.h"

namespace loom::report {

namespace {
// printf into a std::string.
template <typename... Args>
void append(std::string& out, const char* format, Args... args) {
  const int n = std::snprintf(nullptr, 0, format, args...);
  std::string piece(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(piece.data(), piece.size(), format, args...);
  piece.pop_back();
  out += piece;
}
}  // namespace

std::string format_safetensors_listing(const io::SafetensorsFile& file, const std::string& path) {
  const io::SafetensorsHeader& h = file.header();
  std::string out;
  append(out, "%s: %zu tensors, %llu data bytes, header %llu bytes\n", path.c_str(), h.tensors.size(),
         static_cast<unsigned long long>(h.data_bytes), static_cast<unsigned long long>(h.header_bytes));
  append(out, "metadata:%s\n", h.metadata.empty() ? " (none)" : "");
  for (const auto& [key, value] : h.metadata) append(out, "  %s: %s\n", key.c_str(), value.c_str());

  // By name, which groups layers; the file's own order is by dtype.
  std::vector<const io::SafetensorsTensorInfo*> rows;
  for (const auto& t : h.tensors) rows.push_back(&t);
  std::sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  size_t name_w = 4, dtype_w = 5, shape_w = 5;
  for (const auto* t : rows) {
    name_w = std::max(name_w, t->name.size());
    dtype_w = std::max(dtype_w, std::string(io::safetensors_dtype_name(t->dtype)).size());
    shape_w = std::max(shape_w, io::shape_string(t->shape).size());
  }
  append(out, "tensors:\n  %-*s  %-*s  %-*s  %s\n", static_cast<int>(name_w), "name", static_cast<int>(dtype_w), "dtype",
         static_cast<int>(shape_w), "shape", "bytes");
  unsigned long long elements = 0;
  for (const auto* t : rows) {
    append(out, "  %-*s  %-*s  %-*s  %llu\n", static_cast<int>(name_w), t->name.c_str(), static_cast<int>(dtype_w),
           io::safetensors_dtype_name(t->dtype), static_cast<int>(shape_w), io::shape_string(t->shape).c_str(),
           static_cast<unsigned long long>(t->nbytes()));
    elements += t->numel();
  }
  append(out, "total: %llu elements in %zu tensors\n", elements, rows.size());
  return out;
}

std::string describe_weights_model(const io::SafetensorsFile& file, const std::string& path) {
  const io::SafetensorsHeader& h = file.header();
  auto config = h.metadata.find("loom.model_config");
  if (config == h.metadata.end()) return "";
  // The family and what the family's formulas give.
  nlohmann::json j = io::parse_json(config->second, path + ": the metadata's loom.model_config");
  const models::ModelStats s = models::ModelConfig::from_json(j).stats();
  std::string out;
  append(out, "model: %s %s\n  %lld parameters", j.value("arch", "llama").c_str(), s.description.c_str(),
         static_cast<long long>(s.total_params));
  if (s.active_params > 0) append(out, " (%lld used per token)", static_cast<long long>(s.active_params));
  append(out, ", decoding cache %lld numbers per token (all layers%s%s)\n", static_cast<long long>(s.kv_cache_floats_per_token),
         s.kv_cache_note.empty() ? "" : "; ", s.kv_cache_note.c_str());
  return out;
}

}  // namespace loom::report
