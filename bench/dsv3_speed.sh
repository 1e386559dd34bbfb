#!/usr/bin/env bash
# DeepSeek-V3 (dsv3-mini) training-step speed, side by side in one run, THREADS threads each:
#   loom        build/loom bench train --preset dsv3-mini
#   dense       the same model with every FFN dense (model.n_dense=6) and d_ff=1237, so that the
#               parameters a token multiplies with match dsv3-mini's (13.55M vs 13.58M): MLA, MTP and the
#               head unchanged, routing and the sparse experts gone (issue 10's "at most ~1.5x a dense
#               model with the same active parameter count")
#   llama       a Llama-style dense model: d_model 384, 6 layers, 6 query heads and 1 key/value head
#               (attention weights 344K per layer against MLA's 307K), d_ff 1280 (= the shared expert
#               plus 4 routed ones), no MTP (14.06M in matrix multiplies)
#   pytorch     bench/pytorch_dsv3.py (the seed's model in PyTorch, the experts in a Python loop)
#   jax-seed    bench/jax_dsv3_seed.py (the seed's own JAX code; skipped without JAX_PY)
# loom/dense/llama run interleaved REPS times (the machine may be shared: compare medians); each run
# also records its process CPU time, and loom's per-step CPU time is taken against a 1-step baseline
# run of the same config (build, peak measurement and one step) made once.
# BF16=1 (default) adds one bf16 run of loom, dense, PyTorch (autocast) and the seed's JAX (its default
# dtype); every run is stopped after LIMIT seconds (default 900). Settings: THREADS, REPS, STEPS, BATCH.
# Results: one line per run in $OUT (default build/bench-dsv3-results.txt, git-ignored), then bench/dsv3_speed_summary.py.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
reps=${REPS:-4}
steps=${STEPS:-3}
batch=${BATCH:-8}
bf16=${BF16:-1}
jax_py=${JAX_PY:-/tmp/jaxvenv/bin/python}
out=${OUT:-build/bench-dsv3-results.txt}
: > "$out"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=$threads
log() { echo "$*" | tee -a "$out"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

declare -A SETS=(
  [loom]="--preset dsv3-mini"
  [dense]="--preset dsv3-mini --set model.n_dense=6 --set model.d_ff=1237"
  [llama]="--preset tiny --set model.vocab_size=8192 --set model.context_length=256 --set model.d_model=384 --set model.num_layers=6 --set model.num_heads=6 --set model.num_kv_heads=1 --set model.d_ff=1280"
)

# run LABEL CMD...: one result line "LABEL | load before | JSON | cpu_s=user+sys of the whole process",
# or "LABEL | load before | failed or stopped after LIMIT s | cpu_s=..." (each run is cut at LIMIT seconds:
# PyTorch's bf16 autocast on a CPU without bf16 units can take hours).
limit=${LIMIT:-900}
run() {
  local label=$1; shift
  local before json cpu
  before=$(load)
  json=$(/usr/bin/time -f "%U %S" -o /tmp/dsv3_speed_time.$$ timeout "$limit" "$@" 2>/dev/null | tail -n 1) || true
  cpu=$(tail -n 1 /tmp/dsv3_speed_time.$$ | awk '{printf "%.2f", $1 + $2}')
  case "$json" in
    "{"*) ;;
    *) json="failed or stopped after $limit s" ;;
  esac
  log "$label | load $before | $json | cpu_s=$cpu"
}

have_torch=0
/usr/bin/python3 -c "import torch" 2>/dev/null && have_torch=1
have_jax=0
[ -x "$jax_py" ] && "$jax_py" -c "import jax, optax" 2>/dev/null && have_jax=1
[ -x build/loom ] || { echo "build/loom is missing: cmake --build build --target loom" >&2; exit 1; }

log "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $threads threads, batch $batch x seq 256, $steps timed steps"
for name in loom dense llama; do
  # shellcheck disable=SC2086
  run "$name-baseline" build/loom bench train ${SETS[$name]} --batch "$batch" --steps 1 --warmup 0 --threads "$threads"
done
for r in $(seq 1 "$reps"); do
  for name in loom dense llama; do
    # shellcheck disable=SC2086
    run "$name" build/loom bench train ${SETS[$name]} --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads"
  done
  if [ "$r" -le 2 ] && [ $have_torch = 1 ]; then
    run pytorch /usr/bin/python3 bench/pytorch_dsv3.py --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads"
  fi
done
[ $have_torch = 1 ] || log "# pytorch skipped: /usr/bin/python3 has no torch"
if [ $have_jax = 1 ]; then
  run jax-seed "$jax_py" bench/jax_dsv3_seed.py --batch "$batch" --steps "$steps" --warmup 0 --threads "$threads"
else
  log "# jax-seed skipped: no python with jax and optax at JAX_PY=$jax_py (python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax optax)"
fi
if [ "$bf16" = 1 ]; then
  run loom-bf16 build/loom bench train ${SETS[loom]} --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads" --bf16
  run dense-bf16 build/loom bench train ${SETS[dense]} --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads" --bf16
  if [ $have_torch = 1 ]; then
    run pytorch-bf16 /usr/bin/python3 bench/pytorch_dsv3.py --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads" --bf16
  fi
  if [ $have_jax = 1 ]; then
    run jax-seed-bf16 "$jax_py" bench/jax_dsv3_seed.py --batch "$batch" --steps "$steps" --warmup 0 --threads "$threads" --dtype bfloat16
  fi
fi
log "# done $(date -u +%H:%MZ), load $(load)"
rm -f /tmp/dsv3_speed_time.$$
/usr/bin/python3 bench/dsv3_speed_summary.py "$out" --steps "$steps"
