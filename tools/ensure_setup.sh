#!/usr/bin/env bash
# Makes a clone ready to run, doing only what is missing: tools/setup.sh (Debian packages, GPT-2's
# vocabulary, the build, the Jane Austen corpus) when the build or the data is not there, else a rebuild
# of build/loom when a source file is newer than it. `./loom` runs it before every command and
# tools/test.sh before the tests (`--tests`: the Python test requirements and clang's libFuzzer too).
# Everything it prints goes to stderr, so a command's stdout (JSON lines, generated text) stays clean.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 1>&2

missing=()
[ -x build/loom ] || missing+=("build/loom")
[ -n "$(ls data/austen/*.txt 2>/dev/null)" ] || missing+=("data/austen")
[ -f data/gpt2/vocab.json ] && [ -f data/gpt2/merges.txt ] || missing+=("data/gpt2")
if [ "${1:-}" = "--tests" ]; then
  python3 -c "import pytest, numpy, nanobind, scikit_build_core" 2>/dev/null || missing+=("Python test modules")
  command -v clang++ >/dev/null || missing+=("clang++ (libFuzzer)")
  command -v mpirun >/dev/null || missing+=("Open MPI (the multi-process tests)")
fi

if ((${#missing[@]})); then
  echo "setup: missing ${missing[*]}: running tools/setup.sh (installs packages, builds, fetches the corpus)"
  tools/setup.sh
elif [ -n "$(find src cli CMakeLists.txt -newer build/loom -print -quit)" ]; then
  echo "setup: sources changed since build/loom was built: rebuilding it"
  cmake --build build -j"$(nproc)" --target loom
fi
