// `loom inspect FILE`: the tensors (name, dtype, shape, bytes) and metadata of a safetensors file.
// A malformed file is an error (exit 1) whose message names what is wrong.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/model.h"

namespace {

void inspect(const std::string& path) {
  const loom::io::SafetensorsFile file = loom::io::SafetensorsFile::open(path);
  const loom::io::SafetensorsHeader& h = file.header();
  std::printf("%s: %zu tensors, %llu data bytes, header %llu bytes\n", path.c_str(), h.tensors.size(),
              static_cast<unsigned long long>(h.data_bytes), static_cast<unsigned long long>(h.header_bytes));
  std::printf("metadata:%s\n", h.metadata.empty() ? " (none)" : "");
  for (const auto& [key, value] : h.metadata) std::printf("  %s: %s\n", key.c_str(), value.c_str());

  // By name, which groups layers; the file's own order is by dtype.
  std::vector<const loom::io::SafetensorsTensorInfo*> rows;
  for (const auto& t : h.tensors) rows.push_back(&t);
  std::sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  size_t name_w = 4, dtype_w = 5, shape_w = 5;
  for (const auto* t : rows) {
    name_w = std::max(name_w, t->name.size());
    dtype_w = std::max(dtype_w, std::string(loom::io::safetensors_dtype_name(t->dtype)).size());
    shape_w = std::max(shape_w, loom::io::shape_string(t->shape).size());
  }
  std::printf("tensors:\n  %-*s  %-*s  %-*s  %s\n", static_cast<int>(name_w), "name",
              static_cast<int>(dtype_w), "dtype",
              static_cast<int>(shape_w), "shape", "bytes");
  unsigned long long elements = 0;
  for (const auto* t : rows) {
    std::printf("  %-*s  %-*s  %-*s  %llu\n", static_cast<int>(name_w), t->name.c_str(),
                static_cast<int>(dtype_w), loom::io::safetensors_dtype_name(t->dtype), static_cast<int>(shape_w),
                loom::io::shape_string(t->shape).c_str(), static_cast<unsigned long long>(t->nbytes()));
    elements += t->numel();
  }
  std::printf("total: %llu elements in %zu tensors\n", elements, rows.size());

  // A loom weights file says which model it holds: its family and what the family's formulas give.
  auto config = h.metadata.find("loom.model_config");
  if (config != h.metadata.end()) {
    nlohmann::json j = loom::io::parse_json(config->second, path + ": the metadata's loom.model_config");
    const loom::models::ModelStats s = loom::models::ModelConfig::from_json(j).stats();
    std::printf("model: %s %s\n  %lld parameters", j.value("arch", "llama").c_str(), s.description.c_str(),
                static_cast<long long>(s.total_params));
    if (s.active_params > 0) std::printf(" (%lld used per token)", static_cast<long long>(s.active_params));
    std::printf(", decoding cache %lld numbers per token (all layers%s%s)\n",
                static_cast<long long>(s.kv_cache_floats_per_token), s.kv_cache_note.empty() ? "" : "; ",
                s.kv_cache_note.c_str());
  }
}

loom::cli::Register reg("inspect", "List the tensors and metadata of a safetensors file", [](CLI::App& cmd) {
  auto path = std::make_shared<std::string>();
  cmd.add_option("file", *path, "The .safetensors file")->required();
  cmd.callback([path] { inspect(*path); });
});

}  // namespace
