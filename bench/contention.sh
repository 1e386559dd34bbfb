#!/usr/bin/env bash
# How a training step slows down when other processes want the same cores: loom and compiled PyTorch 2.x,
# each alone and beside 1 and 2 busy background processes (plain and niced), one row per pair, so every
# ratio compares runs taken minutes apart under the same other load.
#
#   bench/contention.sh                       # default preset (loom train's model, batch 16) and cs336 b8
#   WORKLOADS="default:16" STEPS=5 TORCH_PY=/tmp/torch2venv/bin/python bench/contention.sh
#   LOOM_ENV="OMP_WAIT_POLICY=passive" bench/contention.sh   # loom under another OpenMP wait policy
# SPIN_COLUMN=1 (the default) adds a column with loom under GNU OpenMP's own spin (GOMP_SPINCOUNT=300000,
# what loom ran with before it set a bounded spin itself; src/core/parallel.h).
#
# The busy processes are shell loops started in their own session (setsid), as another user's job would
# be: with autogroup scheduling (Linux's default for desktop and server kernels alike) a plain `nice`
# inside the benchmark's session would only rank them against the benchmark's own group; "niced" rows
# set both the process's nice value and its autogroup's to 19. Results: stdout and build/contention.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
steps=${STEPS:-5}
workloads=${WORKLOADS:-"default:16 cs336-tinystories:8"}
torch_py=${TORCH_PY:-/tmp/torch2venv/bin/python}
loom_env=${LOOM_ENV:-}
out=${OUT:-build/contention.txt}
loom_bin=${LOOM:-build/loom}  # copy it elsewhere first if you rebuild while this runs
mkdir -p "$(dirname "$out")"
: > "$out"
log() { echo "$*" | tee -a "$out"; }

# On a machine that others share, run the script raised so that their jobs do not blur the rows (the
# busy processes of the "plain" rows get the same raised priority, so they still compete as equals):
#   setsid bash -c 'echo -20 > /proc/$$/autogroup; exec nice -n -20 bench/contention.sh'
own_group_nice=$(sed -n 's/.* nice \(-\{0,1\}[0-9]*\).*/\1/p' /proc/self/autogroup 2>/dev/null || echo 0)
own_group_nice=${own_group_nice:-0}
busy_pids=()
start_busy() {  # start_busy N nice|plain
  local i pid
  for ((i = 0; i < $1; ++i)); do
    setsid sh -c 'while :; do :; done' &
    busy_pids+=("$!")
  done
  sleep 0.3  # setsid has made each one's own autogroup by now (set earlier, it would change ours)
  for pid in "${busy_pids[@]}"; do
    if [ "$2" = nice ]; then
      renice -n 19 -p "$pid" >/dev/null
      echo 19 > "/proc/$pid/autogroup" 2>/dev/null || true
    else  # the benchmark's own priority (this script may run raised: see below)
      renice -n "$(nice)" -p "$pid" >/dev/null
      echo "$own_group_nice" > "/proc/$pid/autogroup" 2>/dev/null || true
    fi
  done
  sleep 0.2
}
stop_busy() {
  local pid
  for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${busy_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # On a machine that others share, run the script raised so that their jobs do not blur the rows (the
# busy processes of the "plain" rows get the same raised priority, so they still compete as equals):
#   setsid bash -c 'echo -20 > /proc/$$/autogroup; exec nice -n -20 bench/contention.sh'
own_group_nice=$(sed -n 's/.* nice \(-\{0,1\}[0-9]*\).*/\1/p' /proc/self/autogroup 2>/dev/null || echo 0)
own_group_nice=${own_group_nice:-0}
busy_pids=()
}
trap stop_busy EXIT

tok() { sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p' | tail -1; }
have_torch=0
[ -x "$torch_py" ] && "$torch_py" -c "import torch; assert hasattr(torch, 'compile')" 2>/dev/null && have_torch=1

log "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $threads threads, $steps timed steps, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
log "# autogroup nice $own_group_nice, process nice $(nice)"
log "# loom env: ${loom_env:-(none)}; OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
[ "$have_torch" = 1 ] || log "# no PyTorch 2.x at $torch_py (tools/peer_venv.sh): loom only"
spin_column=${SPIN_COLUMN:-1}
log "| workload | background | loom tok/s | loom slowdown | loom, libgomp's spin: tok/s | slowdown | torch.compile tok/s | torch.compile slowdown |"
log "|---|---|---|---|---|---|---|---|"
for w in $workloads; do
  preset=${w%%:*}
  batch=${w##*:}
  loom_alone="" spin_alone="" torch_alone=""
  for bg in "0 plain" "1 plain" "1 nice" "2 plain" "2 nice"; do
    set -- $bg
    [ "$1" = 0 ] || start_busy "$1" "$2"
    l=$(env $loom_env "$loom_bin" bench train --preset "$preset" --batch "$batch" --steps "$steps" --threads "$threads" | tok)
    g=""
    if [ "$spin_column" = 1 ]; then
      g=$(env GOMP_SPINCOUNT=300000 "$loom_bin" bench train --preset "$preset" --batch "$batch" --steps "$steps" --threads "$threads" | tok)
    fi
    t=""
    if [ "$have_torch" = 1 ]; then
      t=$(OMP_NUM_THREADS=$threads "$torch_py" bench/pytorch_train.py --preset "$preset" --batch "$batch" \
            --steps "$steps" --threads "$threads" --compile 2>/dev/null | tok)
    fi
    stop_busy
    [ -n "$loom_alone" ] || loom_alone=$l
    [ -n "$torch_alone" ] || torch_alone=$t
    [ -n "$spin_alone" ] || spin_alone=$g
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }
    label=$([ "$1" = 0 ] && echo alone || echo "$1 busy ($2)")
    log "| $preset b$batch | $label | $(printf %.0f "${l:-0}") | $(ratio "$loom_alone" "$l") | $(printf %.0f "${g:-0}") | $(ratio "$spin_alone" "$g") | $(printf %.0f "${t:-0}") | $(ratio "$torch_alone" "$t") |"
  done
done
