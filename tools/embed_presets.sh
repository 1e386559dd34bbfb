#!/usr/bin/env bash
# Regenerates src/train/presets.cpp from configs/*.json, so the presets are compiled into `loom`
# (`--config tiny` works from any directory). tests/trainkit/config_test.cpp fails when the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
out=src/train/presets.cpp
ident() { echo "k$(echo "$1" | sed -E 's/(^|[-_])([a-z0-9])/\U\2/g')"; }
names=()
for f in configs/*.json; do names+=("$(basename "$f" .json)"); done
{
  cat <<'HEAD'
// The built-in presets, compiled in so that `--config tiny` works from any directory.
// Generated from configs/*.json by tools/embed_presets.sh; tests/trainkit/config_test.cpp fails if a
// copy here differs from its file, so edit the JSON file and rerun the script.
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"

namespace loom::train {
namespace {

struct Preset {
  const char* name;
  const char* text;
};
HEAD
  for n in "${names[@]}"; do
    printf 'constexpr const char* %s = R"json(' "$(ident "$n")"
    cat "configs/$n.json"
    printf ')json";\n'
  done
  echo "constexpr Preset kPresets[] = {"
  for n in "${names[@]}"; do printf '    {"%s", %s},\n' "$n" "$(ident "$n")"; done
  cat <<'TAIL'
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

const char* preset_text(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name == p.name) return p.text;
  }
  std::string known;
  for (const auto& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  LOOM_FAIL("config: no preset named \"", name, "\" and no such file (presets: ", known, ")");
}

}  // namespace loom::train
TAIL
} > "$out"
echo "wrote $out (${names[*]})"
