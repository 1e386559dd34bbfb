#!/usr/bin/env bash
# Produces the README's performance block for the CPU it runs on, side by side in one run, THREADS (2)
# threads each:
#   * the CPU (model name, the kind its family/model numbers mean, the SIMD flags that matter), the load
#     average before and after, the FMA peak (`loom bench peak`, at the start and the end) and the memory
#     read bandwidth (`loom bench bandwidth`);
#   * full training steps (forward, backward, clip, AdamW) of each preset in PRESETS (default all three):
#       cs336-tinystories  the CS336 Llama, batch 8, context 256          (CS336_STEPS, default 5)
#       gpt2-small         GPT-2 small, tied, batch 4, context 256        (GPT2_STEPS, default 3)
#       dsv3-mini          the seed's DeepSeek-V3, batch 8, context 256  (DSV3_STEPS, default 3)
#     each in: loom f32 and --bf16; PyPI's PyTorch 2.x (TORCH_PY, a venv made by tools/peer_venv.sh)
#     eager and torch.compile'd, f32 and bf16 autocast; Debian's PyTorch 1.13 (/usr/bin/python3, eager:
#     it has no torch.compile) f32, and bf16 on CPUs with bf16 instructions. The PyTorch models are
#     bench/pytorch_train.py (Llama, GPT-2) and bench/pytorch_dsv3.py (DeepSeek-V3).
#     The variants of a preset run back to back and the presets in turn, ROUNDS (1) times over, so each
#     ratio in a round comes from neighbouring runs. Every run reports its peak RSS (VmHWM) and its RSS
#     before the model existed (PyTorch's includes its import: a few hundred MiB).
#   * EXTRAS=1 adds the older extras: PyTorch 1.13 with OpenBLAS's AVX2 kernels, the tiny preset,
#     tokenizer training and GPT-2 encoding vs tiktoken, and bench/dsv3_speed.sh.
# Every run is stopped after LIMIT seconds (default 600) and reported as "did not finish N steps in M s"
# instead of hanging. On a CPU without bf16 instructions (no avx512_bf16/amx_bf16) PyTorch's bf16
# autocast is emulated and very slow (PyTorch 1.13 did not finish 4 GPT-2 steps in 24 minutes on Zen 3),
# so there its bf16 rows run for the first preset in the first round only, 1 warm-up + 1 timed step
# under BF16_LIMIT (default 120 s); BF16_PEERS=all|first|none overrides.
# Results: one line per run in OUT (default bench-results.txt), then the Markdown tables of
# bench/bench_readme_summary.py, and the total time. On a 2-core Zen 3 (AVX2) one round took 859 s
# (14 min; 2026-12-01, raised above other jobs, torch.compile's cache warm for cs336 only), of which
# 240 s were the two bf16 PyTorch rows that ran out their time; ROUNDS=2 took 1146 s (19 min, the cache
# warm). Run it on an otherwise idle machine:
#   TORCH_PY=/tmp/torch2venv/bin/python ROUNDS=2 tools/bench_readme.sh
#   PRESETS=cs336-tinystories tools/bench_readme.sh      # one preset
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
rounds=${ROUNDS:-1}
presets=${PRESETS:-cs336-tinystories gpt2-small dsv3-mini}
torch_py=${TORCH_PY:-/tmp/torch2venv/bin/python}
limit=${LIMIT:-600}
out=${OUT:-bench-results.txt}
script_start=$(date +%s)
log() { echo "$*" | tee -a "$out"; }
export OMP_NUM_THREADS=$threads

[ -x build/loom ] || { echo "build/loom is missing: cmake --build build --target loom" >&2; exit 1; }

# The CPU kind from /proc/cpuinfo's vendor, family and model numbers (lscpu's model name is often just
# "AMD EPYC" inside a VM).
cpu_kind() {
  local vendor family model
  vendor=$(sed -n 's/^vendor_id\s*: //p' /proc/cpuinfo | head -1)
  family=$(sed -n 's/^cpu family\s*: //p' /proc/cpuinfo | head -1)
  model=$(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1)
  case "$vendor/$family/$model" in
    AuthenticAMD/25/*)
      if (( model < 16 || (model >= 32 && model < 96) )); then echo "Zen 3"; else echo "Zen 4"; fi ;;
    AuthenticAMD/26/*) echo "Zen 5" ;;
    AuthenticAMD/23/*) echo "Zen 2 or earlier" ;;
    GenuineIntel/6/143) echo "Sapphire Rapids" ;;
    GenuineIntel/6/207) echo "Emerald Rapids" ;;
    GenuineIntel/6/173|GenuineIntel/6/174) echo "Granite Rapids" ;;
    GenuineIntel/6/106|GenuineIntel/6/108) echo "Ice Lake" ;;
    *) echo "unknown ($vendor family $family model $model)" ;;
  esac
}
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|avx512_vnni|avx_vnni|amx_bf16|amx_tile)$' | tr '\n' ' ' | sed 's/ $//')
has_bf16=0
case " $isa " in *" avx512_bf16 "*|*" amx_bf16 "*) has_bf16=1 ;; esac
load() { cut -d' ' -f1-3 /proc/loadavg; }

# The presets: loom's arguments, the PyTorch script's, timed steps, warm-up steps.
preset_loom() {
  case $1 in
    cs336-tinystories) echo "--preset cs336-tinystories --batch 8" ;;
    gpt2-small) echo "--preset gpt2-small --set model.context_length=256 --batch 4" ;;
    dsv3-mini) echo "--preset dsv3-mini --batch 8" ;;
    *) return 1 ;;
  esac
}
preset_peer() {
  case $1 in
    cs336-tinystories) echo "bench/pytorch_train.py --preset cs336-tinystories --batch 8" ;;
    gpt2-small) echo "bench/pytorch_train.py --preset gpt2-small --context 256 --batch 4" ;;
    dsv3-mini) echo "bench/pytorch_dsv3.py --config dsv3-mini --batch 8" ;;
  esac
}
preset_steps() {
  case $1 in
    cs336-tinystories) echo "${CS336_STEPS:-5}" ;;
    gpt2-small) echo "${GPT2_STEPS:-3}" ;;
    dsv3-mini) echo "${DSV3_STEPS:-3}" ;;
  esac
}
preset_warmup() { case $1 in cs336-tinystories) echo 2 ;; *) echo 1 ;; esac; }
for p in $presets; do
  preset_loom "$p" >/dev/null || { echo "unknown preset '$p' in PRESETS (cs336-tinystories, gpt2-small, dsv3-mini)" >&2; exit 2; }
done
for v in THREADS=$threads ROUNDS=$rounds LIMIT=$limit CS336_STEPS=$(preset_steps cs336-tinystories) \
         GPT2_STEPS=$(preset_steps gpt2-small) DSV3_STEPS=$(preset_steps dsv3-mini) BF16_LIMIT=${BF16_LIMIT:-1}; do
  [[ "${v#*=}" =~ ^[1-9][0-9]*$ ]] || { echo "${v%%=*} must be a positive whole number, got '${v#*=}'" >&2; exit 2; }
done
case "${BF16_PEERS:-all}" in all|first|none) ;; *) echo "BF16_PEERS must be all, first or none, got '$BF16_PEERS'" >&2; exit 2 ;; esac
: > "$out"

# run PRESET VARIANT ROUND STEPS WARMUP LIMIT CMD...: one result line
#   "PRESET | VARIANT | round R | load A B C | WALL s | JSON"  or  "... | did not finish N steps in M s"
# (N counts the warm-up steps, which torch.compile spends compiling) or "... | failed (exit X): ...".
run() {
  local preset=$1 variant=$2 round=$3 steps=$4 warmup=$5 lim=$6; shift 6
  local before t0 json rc=0 err
  before=$(load)
  t0=$(date +%s)
  err=$(mktemp)
  json=$(timeout "$lim" "$@" 2>"$err" | tail -n 1) || rc=$?
  local wall=$(( $(date +%s) - t0 ))
  case "$json" in
    "{"*) log "$preset | $variant | round $round | load $before | ${wall} s | $json" ;;
    *)
      if [ "$rc" = 124 ]; then
        log "$preset | $variant | round $round | load $before | ${wall} s | did not finish $((warmup + steps)) steps ($warmup warm-up) in $lim s"
      else
        log "$preset | $variant | round $round | load $before | ${wall} s | failed (exit $rc): $(grep -v '^\s*$' "$err" | tail -n 1 | cut -c1-200)"
      fi ;;
  esac
  rm -f "$err"
}

log "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p') ($(cpu_kind); family $(sed -n 's/^cpu family\s*: //p' /proc/cpuinfo | head -1) model $(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1)), $(nproc) CPUs, ISA: $isa, $threads threads, load $(load)"
log "peak: $(build/loom bench peak --threads "$threads")"
log "bandwidth: $(build/loom bench bandwidth --threads "$threads" --mib 512)"
torch2=0
if [ -x "$torch_py" ] && "$torch_py" -c "import torch; assert int(torch.__version__.split('.')[0]) >= 2" 2>/dev/null; then
  torch2=1
  log "pytorch 2: $torch_py ($("$torch_py" -c 'import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())' 2>/dev/null))"
else
  log "pytorch 2: no venv at $torch_py (make one with tools/peer_venv.sh DIR, then TORCH_PY=DIR/bin/python); its rows are skipped"
fi
torch1=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  torch1=1
  log "pytorch 1: /usr/bin/python3 ($(/usr/bin/python3 -c 'import torch; print(torch.__version__)'))"
else
  log "pytorch 1: /usr/bin/python3 has no torch; its rows are skipped"
fi
bf16_peers=${BF16_PEERS:-$([ "$has_bf16" = 1 ] && echo all || echo first)}
bf16_limit=${BF16_LIMIT:-$([ "$has_bf16" = 1 ] && echo "$limit" || echo 120)}
first_preset=${presets%% *}
case "$bf16_peers" in
  all) ;;
  first) log "pytorch bf16: no bf16 instructions on this CPU (autocast is emulated): its rows run for $first_preset in round 1 only, 1 warm-up + 1 step, stopped after $bf16_limit s (BF16_PEERS=all runs them everywhere)" ;;
  none) log "pytorch bf16: skipped (BF16_PEERS=none)" ;;
  *) echo "BF16_PEERS must be all, first or none, got '$bf16_peers'" >&2; exit 2 ;;
esac
log "presets: $presets; $rounds round(s); each run stopped after $limit s"

for r in $(seq "$rounds"); do
  for p in $presets; do
    steps=$(preset_steps "$p")
    warm=$(preset_warmup "$p")
    read -r -a loom_args <<< "$(preset_loom "$p")"
    read -r -a peer <<< "$(preset_peer "$p")"
    loom=(build/loom bench train "${loom_args[@]}" --threads "$threads" --steps "$steps" --warmup "$warm")
    py1=(/usr/bin/python3 "${peer[@]}" --threads "$threads" --steps "$steps" --warmup "$warm")
    py2=("$torch_py" "${peer[@]}" --threads "$threads" --steps "$steps" --warmup "$warm")
    # torch.compile compiles in the first warm-up step and may recompile in the second.
    py2c=("$torch_py" "${peer[@]}" --threads "$threads" --steps "$steps" --warmup 2 --compile)
    run "$p" "loom f32" "$r" "$steps" "$warm" "$limit" "${loom[@]}"
    if [ "$torch2" = 1 ]; then
      run "$p" "pytorch2 compile f32" "$r" "$steps" 2 "$limit" "${py2c[@]}"
      run "$p" "pytorch2 eager f32" "$r" "$steps" "$warm" "$limit" "${py2[@]}"
    fi
    [ "$torch1" = 1 ] && run "$p" "pytorch1 eager f32" "$r" "$steps" "$warm" "$limit" "${py1[@]}"
    run "$p" "loom bf16" "$r" "$steps" "$warm" "$limit" "${loom[@]}" --bf16
    if [ "$bf16_peers" = all ] || { [ "$bf16_peers" = first ] && [ "$p" = "$first_preset" ] && [ "$r" = 1 ]; }; then
      bs=$steps bw=$warm
      [ "$bf16_peers" = first ] && bs=1 bw=1
      if [ "$torch2" = 1 ]; then
        run "$p" "pytorch2 compile bf16" "$r" "$bs" "$bw" "$bf16_limit" "$torch_py" "${peer[@]}" --threads "$threads" --steps "$bs" --warmup "$bw" --compile --bf16
        run "$p" "pytorch2 eager bf16" "$r" "$bs" "$bw" "$bf16_limit" "$torch_py" "${peer[@]}" --threads "$threads" --steps "$bs" --warmup "$bw" --bf16
      fi
      if [ "$torch1" = 1 ] && [ "$has_bf16" = 1 ]; then
        run "$p" "pytorch1 eager bf16" "$r" "$bs" "$bw" "$bf16_limit" /usr/bin/python3 "${peer[@]}" --threads "$threads" --steps "$bs" --warmup "$bw" --bf16
      fi
    fi
  done
done
log "peak (end): $(build/loom bench peak --threads "$threads")"

if [ "${EXTRAS:-0}" = 1 ]; then
  steps=$(preset_steps cs336-tinystories)
  # The same PyTorch 1.13 with Debian's OpenBLAS pinned to its AVX2 (Haswell) kernels, as some machines
  # of this workplace set OPENBLAS_CORETYPE.
  run cs336-tinystories "pytorch1 eager f32 openblas-haswell" x "$steps" 2 "$limit" env OPENBLAS_CORETYPE=Haswell /usr/bin/python3 bench/pytorch_train.py --preset cs336-tinystories --batch 8 --steps "$steps" --threads "$threads"
  run tiny "loom f32" x 100 2 "$limit" build/loom bench train --preset tiny --batch 8 --steps 100 --threads "$threads"
  run tiny "pytorch1 eager f32" x 100 2 "$limit" /usr/bin/python3 bench/pytorch_train.py --preset tiny --batch 8 --steps 100 --threads "$threads"
  if [ "$torch2" = 1 ]; then
    run tiny "pytorch2 compile f32" x 100 2 "$limit" "$torch_py" bench/pytorch_train.py --preset tiny --batch 8 --steps 100 --threads "$threads" --compile
  fi
  if [ -x build/bench/loom_bench_tokenizer ]; then
    build/bench/loom_bench_tokenizer --benchmark_min_time=0.2 2>/dev/null | grep -E "^BM_" | tee -a "$out"
  fi
  if python3 -c "import tiktoken" 2>/dev/null && [ -f data/bench/austen.txt ]; then
    python3 bench/tokenizer/encode_vs_tiktoken.py --runs 5 | tee -a "$out"
  fi
  # DeepSeek-V3 beside dense models of its active size and the seed's JAX code (bench/dsv3_speed.sh).
  THREADS=$threads OUT=build/bench-dsv3-results.txt bench/dsv3_speed.sh | tee -a "$out"
fi
log "# end $(date -u +%Y-%m-%dT%H:%MZ), load $(load); total $(( $(date +%s) - script_start )) s"
echo
/usr/bin/python3 bench/bench_readme_summary.py "$out"
