#!/usr/bin/env bash
# One process with 2 threads against 2 MPI ranks with 1 thread each, on the same global batch: is
# loom's thread parallelism worth what the mesh's data parallelism is on the same cores? (issue 31:
# one process x 2 threads must be at least as fast.) For each preset in PRESETS and each of ROUNDS
# rounds it runs `loom train` both ways, back to back, the order swapped every round so neither
# always runs first:
#   threads  OMP_NUM_THREADS=2 loom train --config P --set training.threads=2
#   ranks    mpirun -np 2 loom train --config P --mesh data=2 --parallel dp --set training.threads=1
# both with --set training.max_steps=STEPS, no validation, no checkpoints, no samples. A run's speed is
# the median tokens/s of its metrics.jsonl train events (one per logging.interval = 10 steps), the
# first one (warm-up) left out. The batch is the preset's (tiny and default: 16 sequences); under
# data=2 each rank takes 8 of them, so both runs train on the same global batch (and, under dp, to
# the same losses within rounding).
#
#   tools/ranks_vs_threads.sh                              # tiny and default, 3 rounds
#   PRESETS=tiny ROUNDS=5 tools/ranks_vs_threads.sh
#   STEPS_tiny=400 STEPS_default=100 tools/ranks_vs_threads.sh
# Results: one line per run and a table of the ratios (threads / ranks per round) on stdout and in OUT
# (default build/ranks_vs_threads.txt), with the CPU, the load average before and after, and the date.
# On a shared machine the ratio within a round is the number to quote; the single speeds swing. Beside
# other jobs a 2-thread process loses far more than 2 ranks do (its threads meet at every op; measured
# 0.10x on tiny at load 4-6, docs/mesh.md), so to compare the two ways rather than the load, run it
# raised above the other jobs (as bench/contention.sh explains, a plain nice only ranks it within its
# own session):
#   setsid bash -c 'echo -20 > /proc/$$/autogroup; exec nice -n -20 tools/ranks_vs_threads.sh'
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
presets=${PRESETS:-tiny default}
out=${OUT:-build/ranks_vs_threads.txt}
loom_bin=${LOOM:-build/loom}  # copy it elsewhere first if you rebuild while this runs
mpirun_bin=${MPIRUN:-mpirun}
[ -x "$loom_bin" ] || { echo "$loom_bin is missing: cmake --build build --target loom" >&2; exit 1; }
command -v "$mpirun_bin" >/dev/null || { echo "no $mpirun_bin on PATH: the ranks need Open MPI (tools/setup.sh)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
: > "$out"
log() { echo "$*" | tee -a "$out"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

steps_of() {  # the timed run's length per preset: enough 10-step windows for a median
  local var="STEPS_$1"
  case $1 in
    tiny) echo "${!var:-300}" ;;
    *) echo "${!var:-80}" ;;
  esac
}
# as root, Open MPI wants to be told
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)

common() {  # common PRESET DIR
  echo --config "$1" --out "$2" --overwrite --set "training.max_steps=$(steps_of "$1")" \
    --set eval.interval=0 --set checkpoint.interval=0 --set sample.num_samples=0 --set logging.progress=none
}
median_tps() {  # median tokens/s of a run's train events, the first left out
  python3 - "$1/metrics.jsonl" <<'EOF'
import json, statistics, sys
v = [e["tokens_per_s"] for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "train"][1:]
print(f"{statistics.median(v):.0f}" if v else "nan")
EOF
}
run() {  # run PRESET MODE ROUND -> prints tokens/s
  local dir="$work/$1-$2-$3"
  if [ "$2" = threads ]; then
    # shellcheck disable=SC2046
    OMP_NUM_THREADS=2 "$loom_bin" train $(common "$1" "$dir") --set training.threads=2 >"$dir.log" 2>&1 \
      || { echo "threads run failed: $dir.log" >&2; cat "$dir.log" >&2; exit 1; }
  else
    # shellcheck disable=SC2046
    OMP_NUM_THREADS=1 "$mpirun_bin" "${root_flag[@]}" --oversubscribe -np 2 -x OMP_NUM_THREADS \
      "$loom_bin" train $(common "$1" "$dir") --mesh data=2 --parallel dp --set training.threads=1 >"$dir.log" 2>&1 \
      || { echo "ranks run failed: $dir.log" >&2; cat "$dir.log" >&2; exit 1; }
  fi
  median_tps "$dir"
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
log "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(sed -n 's/^cpu family\s*: //p' /proc/cpuinfo | head -1) model $(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1)), $(nproc) CPUs, load before: $(load)"
log "# loom $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $rounds rounds; OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
log "| preset | round | 1 process x 2 threads tok/s | 2 ranks x 1 thread tok/s | threads / ranks | load after |"
log "|---|---|---|---|---|---|"
declare -A ratios
for ((r = 1; r <= rounds; ++r)); do
  for p in $presets; do
    if ((r % 2)); then t=$(run "$p" threads "$r"); k=$(run "$p" ranks "$r")
    else k=$(run "$p" ranks "$r"); t=$(run "$p" threads "$r"); fi
    ratio=$(python3 -c "print(f'{$t / $k:.2f}')")
    ratios[$p]="${ratios[$p]:-} $ratio"
    log "| $p ($(steps_of "$p") steps) | $r | $t | $k | $ratio | $(load) |"
  done
done
for p in $presets; do
  log "# $p: threads / ranks per round:${ratios[$p]} (median $(python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" ${ratios[$p]}))"
done
log "# $(date -u +%H:%MZ) load after: $(load)"
