#!/usr/bin/env bash
# Produces the numbers in the README's performance table, side by side in one run, 2 threads each:
#   * the CPU (model, family/model numbers and the kind they mean, the SIMD flags that matter);
#   * the FMA peak (loom bench peak) and the memory read bandwidth (loom bench bandwidth);
#   * a full training step of the CS336 model (cs336-tinystories, batch 8) in loom (f32 and --bf16) and
#     in PyTorch (bench/pytorch_train.py): Debian's PyTorch 1.13 (/usr/bin/python3, eager only: it has
#     no torch.compile) and PyPI's PyTorch 2.x (TORCH_PY, a venv made by tools/peer_venv.sh; skipped with
#     a message when absent), eager and torch.compile'd, f32 and bf16 autocast, in interleaved rounds;
#     each row also gives the process's peak RSS (GNU time's %M);
#   * tokenizer training and GPT-2 encoding vs tiktoken (needs `pip install tiktoken`).
# Results go to stdout and bench-results.txt. Run it on an otherwise idle machine.
#   THREADS=2 STEPS=10 ROUNDS=2 TORCH_PY=/tmp/torch2venv/bin/python tools/bench_readme.sh
# On a CPU without bf16 instructions (no avx512_bf16/amx_bf16) PyTorch's bf16 autocast is emulated and
# very slow (GPT-2 small did not finish 4 steps in 24 minutes on Zen 3; a cs336 run of this script there
# did not get through PyTorch 1.13's bf16 row in 10 minutes), so its bf16 rows are skipped there with a
# line saying so; BF16_PEERS=1 runs them anyway, with BF16_SLOW_STEPS (default 2) timed steps.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
steps=${STEPS:-10}
rounds=${ROUNDS:-2}
torch_py=${TORCH_PY:-/tmp/torch2venv/bin/python}
out=bench-results.txt
: > "$out"
log() { echo "$*" | tee -a "$out"; }

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
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|avx512_vnni|avx_vnni|amx_bf16|amx_tile)$' | tr '\n' ' ')
has_bf16=0
case " $isa " in *" avx512_bf16 "*|*" amx_bf16 "*) has_bf16=1 ;; esac

# Runs a command, appending its peak RSS: "label: <json> rss_mib=N".
row() {
  local label=$1; shift
  local tmp; tmp=$(mktemp)
  local result
  if result=$(/usr/bin/time -f '%M' -o "$tmp" "$@" 2>/dev/null | tail -1); then
    log "$label: $result rss_mib=$(( $(tail -1 "$tmp") / 1024 ))"
  else
    log "$label: FAILED (exit $?)"
  fi
  rm -f "$tmp"
}

log "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p') ($(cpu_kind); family $(sed -n 's/^cpu family\s*: //p' /proc/cpuinfo | head -1) model $(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1)), $(nproc) CPUs, ISA: $isa, $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
log "peak: $(build/loom bench peak --threads "$threads")"
log "model: cs336-tinystories (vocab 10000, context 256, d_model 512, 4 layers, 16 heads, d_ff 1344), batch 8, $steps timed steps"
log "bandwidth: $(build/loom bench bandwidth --threads "$threads" --mib 512)"
torch2=0
if [ -x "$torch_py" ] && "$torch_py" -c "import torch; assert int(torch.__version__.split('.')[0]) >= 2" 2>/dev/null; then
  torch2=1
  log "pytorch 2: $torch_py ($("$torch_py" -c 'import torch; print(torch.__version__)'))"
else
  log "pytorch 2: no venv at $torch_py (make one with tools/peer_venv.sh DIR, then TORCH_PY=DIR/bin/python); its rows are skipped"
fi
bf16_steps=$steps
[ "$has_bf16" = 1 ] || bf16_steps=${BF16_SLOW_STEPS:-2}
common=(--preset cs336-tinystories --batch 8 --threads "$threads")
py1=(env OMP_NUM_THREADS="$threads" /usr/bin/python3 bench/pytorch_train.py "${common[@]}")
py2=(env OMP_NUM_THREADS="$threads" "$torch_py" bench/pytorch_train.py "${common[@]}")
loom=(build/loom bench train "${common[@]}" --steps "$steps")
bf16_peers=${BF16_PEERS:-$has_bf16}
[ "$bf16_peers" = 1 ] || log "pytorch bf16: skipped (no bf16 instructions on this CPU: autocast is emulated, minutes a step; BF16_PEERS=1 forces it)"
for i in $(seq "$rounds"); do
  log "## round $i"
  row "loom f32" "${loom[@]}"
  row "pytorch1 eager f32" "${py1[@]}" --steps "$steps"
  if [ "$torch2" = 1 ]; then
    row "pytorch2 eager f32" "${py2[@]}" --steps "$steps"
    row "pytorch2 compile f32" "${py2[@]}" --steps "$steps" --compile
  fi
  row "loom bf16" "${loom[@]}" --bf16
  if [ "$bf16_peers" = 1 ]; then
    row "pytorch1 eager bf16 ($bf16_steps steps)" "${py1[@]}" --steps "$bf16_steps" --bf16
    if [ "$torch2" = 1 ]; then
      row "pytorch2 eager bf16 ($bf16_steps steps)" "${py2[@]}" --steps "$bf16_steps" --bf16
      row "pytorch2 compile bf16 ($bf16_steps steps)" "${py2[@]}" --steps "$bf16_steps" --bf16 --compile
    fi
  fi
done
# The same PyTorch 1.13 with Debian's OpenBLAS pinned to its AVX2 (Haswell) kernels, as some machines of
# this workplace set OPENBLAS_CORETYPE.
row "pytorch1 cs336-tinystories b8 openblas-haswell" env OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=$threads /usr/bin/python3 bench/pytorch_train.py --preset cs336-tinystories --batch 8 --steps "$steps" --threads "$threads"
row "loom tiny b8" build/loom bench train --preset tiny --batch 8 --steps 100 --threads "$threads"
row "pytorch1 tiny b8" env OMP_NUM_THREADS=$threads /usr/bin/python3 bench/pytorch_train.py --preset tiny --batch 8 --steps 100 --threads "$threads"
if [ "$torch2" = 1 ]; then
  row "pytorch2 compile tiny b8" env OMP_NUM_THREADS=$threads "$torch_py" bench/pytorch_train.py --preset tiny --batch 8 --steps 100 --threads "$threads" --compile
fi
if [ -x build/bench/loom_bench_tokenizer ]; then
  build/bench/loom_bench_tokenizer --benchmark_min_time=0.2 2>/dev/null | grep -E "^BM_" | tee -a "$out"
fi
if python3 -c "import tiktoken" 2>/dev/null && [ -f data/bench/austen.txt ]; then
  python3 bench/tokenizer/encode_vs_tiktoken.py --runs 5 | tee -a "$out"
fi
# DeepSeek-V3 (dsv3-mini): loom against bench/pytorch_dsv3.py and the seed's own JAX code
# (bench/jax_dsv3_seed.py), and against dense models with the same parameters used per token
# (bench/dsv3_speed.sh has the details; results in build/bench-dsv3-results.txt). The JAX part needs a venv
# with PyPI's jax and optax: python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax optax
# (another one through JAX_PY=...); without it that part is skipped with a message. DSV3=0 skips it all.
if [ "${DSV3:-1}" = 1 ]; then
  if [ -x "${JAX_PY:-/tmp/jaxvenv/bin/python}" ]; then
    log "dsv3: the seed's JAX code with ${JAX_PY:-/tmp/jaxvenv/bin/python}"
  else
    log "dsv3: no JAX venv at ${JAX_PY:-/tmp/jaxvenv/bin/python}; the seed's JAX code is skipped"
  fi
  THREADS=$threads OUT=build/bench-dsv3-results.txt bench/dsv3_speed.sh | tee -a "$out"
fi
