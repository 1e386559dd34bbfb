#!/usr/bin/env bash
# Fuzzes the safetensors reader (fuzz/safetensors_fuzz.cpp) with libFuzzer, ASan and UBSan, for a bounded
# time, seeded with the committed corpus (tests/safetensors/corpus). Exits non-zero on any finding; the
# input that triggered it is left in build-fuzz/artifacts/ (replay: build-fuzz/safetensors_fuzz FILE).
#
#   tools/fuzz.sh            # 60 seconds
#   tools/fuzz.sh 600        # longer
#   tools/fuzz.sh 60 -jobs=2 -workers=2   # extra arguments go to libFuzzer
#
# Needs clang++ and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev; tools/setup.sh installs both).
# Builds only the code under test, into its own directory (build-fuzz/), so it never touches build/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
out=build-fuzz
bin="$out/safetensors_fuzz"
sources=(fuzz/safetensors_fuzz.cpp src/io/safetensors_format.cpp src/io/json.cpp)
headers=(src/io/safetensors_format.h src/io/json.h src/core/error.h)
CXX="${FUZZ_CXX:-clang++}"
mkdir -p "$out/corpus" "$out/artifacts"

stale=0
[ -x "$bin" ] || stale=1
for f in "${sources[@]}" "${headers[@]}" tools/fuzz.sh; do
  [ "$stale" = 1 ] || [ "$f" -nt "$bin" ] && stale=1
done
if [ "$stale" = 1 ]; then
  echo "fuzz.sh: building $bin"
  # -fno-sanitize-recover: a UBSan report must stop the run, or libFuzzer would not count it.
  # -gline-tables-only: symbolized stack traces at a third of -g's compile time (about 20 s on 2 cores,
  # the two files compiled in parallel).
  flags=(-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer
         -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc)
  objects=()
  pids=()
  for src in "${sources[@]}"; do
    obj="$out/$(basename "$src" .cpp).o"
    objects+=("$obj")
    "$CXX" "${flags[@]}" -c "$src" -o "$obj" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  "$CXX" "${flags[@]}" "${objects[@]}" -o "$bin"
fi

# The first directory collects new inputs; the committed corpus only seeds the run.
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -dict=fuzz/safetensors.dict -artifact_prefix="$out/artifacts/" \
  "$@" "$out/corpus" tests/safetensors/corpus/valid tests/safetensors/corpus/malformed
