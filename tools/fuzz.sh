#!/usr/bin/env bash
# Fuzzes loom's readers of untrusted files with libFuzzer, ASan and UBSan, for a bounded total time split
# evenly between the targets, each seeded with its committed corpus:
#   safetensors     fuzz/safetensors_fuzz.cpp     safetensors headers   tests/io/corpus
#   config          fuzz/config_fuzz.cpp          training configs      configs/, fuzz/corpus/config
#   tokenizer_json  fuzz/tokenizer_json_fuzz.cpp  tokenizer.json and    fuzz/corpus/tokenizer_json
#                                                 vocab.json
#   gguf            fuzz/gguf_fuzz.cpp            GGUF files            tests/gguf/corpus
# Exits non-zero if any target finds something; the input that triggered it is left in
# build-fuzz/<target>/artifacts/ (replay: build-fuzz/<target>/<target>_fuzz FILE).
#
#   tools/fuzz.sh            # 60 seconds in all (15 per target)
#   tools/fuzz.sh 600        # longer
#   FUZZ_TARGETS=config tools/fuzz.sh 60          # one target only
#   tools/fuzz.sh 60 -jobs=2 -workers=2           # extra arguments go to libFuzzer
#
# Needs clang++ and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev; tools/setup.sh installs both)
# and libpcre2-8 (the tokenizer's regex). Builds only the code under test, into its own directory
# (build-fuzz/), so it never touches build/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=(${FUZZ_TARGETS:-safetensors config tokenizer_json gguf})
CXX="${FUZZ_CXX:-clang++}"

# The sources each target compiles (its own file first), its seed directories, dictionary and input size.
sources_of() {
  case "$1" in
    safetensors) echo fuzz/safetensors_fuzz.cpp src/io/safetensors_format.cpp src/io/json.cpp ;;
    config)
      echo fuzz/config_fuzz.cpp src/train/config.cpp src/train/config_file.cpp src/io/json.cpp \
        src/io/json_checked.cpp src/models/model_config.cpp src/models/llama/family.cpp src/models/gpt2/family.cpp ;;
    tokenizer_json)
      echo fuzz/tokenizer_json_fuzz.cpp src/tokenizer/formats.cpp src/tokenizer/tokenizer.cpp \
        src/tokenizer/pretokenizer.cpp src/tokenizer/byte_level.cpp src/tokenizer/sha256.cpp src/io/json.cpp \
        src/io/file.cpp ;;
    gguf) echo fuzz/gguf_fuzz.cpp src/gguf/format.cpp src/quant/quant.cpp src/io/safetensors_format.cpp src/io/json.cpp ;;
    *) echo "fuzz.sh: unknown target $1" >&2; exit 2 ;;
  esac
}
# The config reader reaches the model families' registry (their defaults, validation and presets); what
# the families need beyond the instrumented sources (modules, kernels, HF) comes from the regular build's
# library, uninstrumented (tools/test.sh builds it first).
libs_of() {
  case "$1" in
    tokenizer_json) echo -lpcre2-8 -lpthread ;;
    # A build with the CUDA backend puts its objects in libloom.a: add the libraries CMake listed for it.
    config) echo build/libloom.a -ldnnl -lgomp -lpcre2-8 -lz -lpthread $(cat build/cuda_link_flags.txt 2>/dev/null) ;;
  esac
}
corpora_of() {
  case "$1" in
    safetensors) echo tests/io/corpus/valid tests/io/corpus/malformed ;;
    config) echo configs fuzz/corpus/config ;;
    tokenizer_json) echo fuzz/corpus/tokenizer_json ;;
    gguf) echo tests/gguf/corpus/valid tests/gguf/corpus/malformed ;;
  esac
}
max_len_of() { [ "$1" = tokenizer_json ] && echo 16384 || echo 4096; }

build() {
  local t="$1" out="build-fuzz/$1" bin="build-fuzz/$1/$1_fuzz"
  local sources=($(sources_of "$t"))
  mkdir -p "$out/corpus" "$out/artifacts"
  # Stale when any source, any header under src/ or this script is newer than the binary.
  if [ -x "$bin" ] && [ ! tools/fuzz.sh -nt "$bin" ] &&
     [ -z "$(find "${sources[@]}" -newer "$bin"; find src -name '*.h' -newer "$bin")" ]; then
    return 0
  fi
  echo "fuzz.sh: building $bin"
  # -fno-sanitize-recover: a UBSan report must stop the run, or libFuzzer would not count it.
  # -gline-tables-only: symbolized stack traces at a third of -g's compile time. Two compiles at a time.
  local flags=(-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer
               -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc)
  local objects=() pids=() src obj
  for src in "${sources[@]}"; do
    obj="$out/$(echo "${src%.cpp}" | tr / _).o"  # by path: two families both have a family.cpp
    objects+=("$obj")
    "$CXX" "${flags[@]}" -c "$src" -o "$obj" &
    pids+=($!)
    if [ "${#pids[@]}" -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  "$CXX" "${flags[@]}" "${objects[@]}" $(libs_of "$t") -o "$bin"
}

for t in "${targets[@]}"; do build "$t"; done

per_target=$(( seconds / ${#targets[@]} ))
[ "$per_target" -ge 5 ] || per_target=5
failed=()
for t in "${targets[@]}"; do
  out="build-fuzz/$t"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "fuzz.sh: $t for ${per_target}s"
  # The first directory collects new inputs; the committed corpus only seeds the run.
  if ! "$out/${t}_fuzz" -max_total_time="$per_target" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len_of "$t")" \
       -print_final_stats=1 "${dict[@]}" -artifact_prefix="$out/artifacts/" \
       "$@" "$out/corpus" $(corpora_of "$t"); then
    failed+=("$t")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs in build-fuzz/<target>/artifacts/)" >&2
  exit 1
fi
