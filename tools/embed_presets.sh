#!/usr/bin/env bash
# Regenerates src/models/<arch>/presets.cpp from configs/*.json (each file goes to the family its
# model.arch names), so the presets are compiled into `loom` (`--config tiny` works from any directory).
# tests/trainkit/config_test.cpp fails when a compiled copy differs from its file.
set -euo pipefail
cd "$(dirname "$0")/.."
ident() { echo "k$(echo "$1" | sed -E 's/(^|[-_])([a-z0-9])/\U\2/g')"; }
arch_of() { sed -nE 's/^ *"arch": *"([a-z0-9_]+)".*/\1/p' "$1" | head -n 1; }
archs=()
for d in src/models/*/; do
  [ -f "$d/family.h" ] && archs+=("$(basename "$d")")
done
for arch in "${archs[@]}"; do
  out="src/models/$arch/presets.cpp"
  names=()
  for f in configs/*.json; do
    [ "$(arch_of "$f")" = "$arch" ] && names+=("$(basename "$f" .json)")
  done
  {
    cat <<HEAD
// The built-in presets of the $arch family, compiled in so that \`--config NAME\` works from any
// directory. Generated from configs/*.json by tools/embed_presets.sh; tests/trainkit/config_test.cpp
// fails if a copy here differs from its file, so edit the JSON file and rerun the script.
#include "models/$arch/family.h"

namespace loom::$arch {
HEAD
    for n in "${names[@]}"; do
      printf 'namespace {\nconstexpr const char* %s = R"json(' "$(ident "$n")"
      cat "configs/$n.json"
      printf ')json";\n}  // namespace\n'
    done
    echo ""
    echo "std::vector<models::Preset> presets() {"
    echo "  return {"
    for n in "${names[@]}"; do printf '      {"%s", %s},\n' "$n" "$(ident "$n")"; done
    echo "  };"
    echo "}"
    echo ""
    echo "}  // namespace loom::$arch"
  } > "$out"
  echo "wrote $out (${names[*]:-no presets})"
done
