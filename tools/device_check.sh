#!/usr/bin/env bash
# The CUDA backend's check on a lent GPU (docs/cuda.md), in two halves:
#
#   tools/device_check.sh build     # here (optional, ~20 min on 2 cores): builds the CUDA tests and the
#                                   # loom CLI into build-gpu/ for any x86-64-v3 CPU, without MPI, so
#                                   # the GPU machine need not spend its minutes compiling
#   tools/device_check.sh prepare   # here, on a CPU machine with apt: fetches what the GPU machine
#                                   # lacks into build-device/ (git-ignored), ~15 MB, and the stripped
#                                   # programs of build-gpu/ when it has them
#   tools/device_check.sh run       # on the GPU machine, from the repository root, with build-device
#                                   # carried: builds loom's CUDA tests there and runs them
#
# The device tool's call, after `prepare`:
#   run(command="bash tools/device_check.sh run", carry=["build-device"], timeout_s=570)
#
# The GPU machine has the CUDA toolkit, CMake, a C++ compiler and Python, but neither apt nor network,
# nor loom's CPU dependencies (oneDNN, nlohmann-json, CLI11, PCRE2, GoogleTest): `prepare` downloads
# those as Debian packages, and `run` unpacks them into build-device/root and points CMake at it.
# `run` writes into $OUT (the device tool brings it back; build-device/out elsewhere), at most 8 files:
#   summary.md        the table: machine, build, each CUDA test's result and time
#   device_check.log  everything the script printed
#   cuda_tests.json   GoogleTest's report of tests/backends/cuda
#   core_tests.log    the allocator and step-capture suites (tests/core) on that machine
#   sanitizer.log     compute-sanitizer memcheck over the kernel tests, when the tool and time allow
#   bench.jsonl       `loom bench train --device cuda` lines (GPT-2 small, a Llama, dsv3-mini), when time allows
#   warp_attention.log  the attention tests on the one-warp-per-row kernels (LOOM_CUDA_ATTENTION=warp)
#   train_gpu.jsonl   metrics.jsonl of a short `loom train --device cuda` run (GPT-2 small, bf16), when time allows
# Every step is time-boxed so the whole run ends inside 9 minutes and the summary is always written.
# LOOM_DEVICE_CHECK_CONFIGURE_ONLY=1 stops `run` after CMake has configured against the unpacked
# packages: how this script itself is checked on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
bundle=build-device

# Debian packages loom builds against (tools/setup.sh's list, less what a CUDA image has).
# cpp-httplib (`loom serve`) brings OpenSSL and Brotli; libgomp1 is for the programs built here.
debs=(libdnnl-dev libdnnl2 ocl-icd-libopencl1 nlohmann-json3-dev libcli11-dev
      libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
      libgtest-dev libgmock-dev zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3 pkg-config
      libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1 libgomp1)
programs=(tests/loom_test_backends_cuda tests/loom_test_core loom)

if [ "$mode" = build ]; then
  set -e
  # Portable host code (the GPU machine's CPU is not this one; loom's kernels dispatch on the CPU at run
  # time) and no MPI (the one-GPU check runs one process; Open MPI is not on the GPU machine).
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_NATIVE=OFF \
    -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DLOOM_BUILD_PYTHON=OFF \
    -DLOOM_BUILD_BENCH=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target loom_test_backends_cuda loom_test_core loom
  exit 0
fi

if [ "$mode" = prepare ]; then
  set -e
  rm -rf "$bundle"  # only the packages travel (the device tool's carry limit is 64 MiB)
  mkdir -p "$bundle/debs"
  [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update -qq
  (cd "$bundle/debs" && apt-get download "${debs[@]}")
  if [ -x build-gpu/loom ]; then
    mkdir -p "$bundle/prebuilt"
    for p in "${programs[@]}"; do strip -o "$bundle/prebuilt/$(basename "$p")" "build-gpu/$p"; done
    git rev-parse HEAD >"$bundle/prebuilt/commit"
    echo "prebuilt programs from build-gpu/ (commit $(git rev-parse --short HEAD); rebuild it if the tree moved on)"
  fi
  du -sh "$bundle"
  echo "prepared $bundle; now, with the device tool:"
  echo '  run(command="bash tools/device_check.sh run", carry=["build-device"], timeout_s=570)'
  exit 0
fi
if [ "$mode" != run ]; then
  echo "usage: tools/device_check.sh prepare|run" >&2
  exit 2
fi

OUT="${OUT:-$bundle/out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
note() { echo "== [$(elapsed)s] $*"; }
summary="$OUT/summary.md"
build_status="not started"

note "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
nvcc --version | tail -2 || echo "no nvcc on PATH"
cmake --version | head -1
nproc; grep -m1 "model name" /proc/cpuinfo; grep -o -m1 -w "avx512f\|amx_tile" /proc/cpuinfo | sort -u | tr "\n" " "; echo

note "unpacking ${#debs[@]} Debian packages into $bundle/root"
root="$PWD/$bundle/root"
rm -rf "$root" && mkdir -p "$root"
for f in "$bundle"/debs/*.deb; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$f" "$root"
  else  # a .deb is an ar archive holding data.tar.*
    tmp=$(mktemp -d) && (cd "$tmp" && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$root") && rm -rf "$tmp"
  fi
done
multiarch=x86_64-linux-gnu
libdir="$root/usr/lib/$multiarch"
# The .pc files say prefix=/usr: point them at the unpacked tree.
for pc in "$libdir"/pkgconfig/*.pc "$root"/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] && sed -i "s|^prefix=/usr\$|prefix=$root/usr|" "$pc"
done
export PKG_CONFIG_PATH="$libdir/pkgconfig:$root/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v pkg-config >/dev/null || export PATH="$PATH:$root/usr/bin"
# cuBLASLt and NCCL where the image keeps them (the toolkit, or the Python wheels' copies).
wheels=$(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null)
for lib in libcublasLt.so.13 libnccl.so.2; do
  dir=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
             /usr/lib/$multiarch $wheels -maxdepth 3 -name "$lib" -printf '%h\n' 2>/dev/null | head -1)
  if [ -n "$dir" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir"; echo "$lib in $dir"; else echo "$lib not found"; fi
done

build="$bundle/build"
bin="$build"
if [ -x "$bundle/prebuilt/loom_test_backends_cuda" ] && [ -z "${LOOM_DEVICE_CHECK_CONFIGURE_ONLY:-}" ]; then
  mkdir -p "$bundle/pre/tests"
  cp "$bundle/prebuilt/loom_test_backends_cuda" "$bundle/prebuilt/loom_test_core" "$bundle/pre/tests/"
  cp "$bundle/prebuilt/loom" "$bundle/pre/"
  if "$bundle/pre/tests/loom_test_backends_cuda" --gtest_list_tests >/dev/null 2>"$OUT/prebuilt.txt"; then
    bin="$bundle/pre"
    build_status="prebuilt here from commit $(cat "$bundle/prebuilt/commit" 2>/dev/null)"
    note "using the prebuilt programs ($build_status)"
  else
    note "the prebuilt programs do not start here; building"; head -5 "$OUT/prebuilt.txt"
  fi
  rm -f "$OUT/prebuilt.txt"
fi

if [ "$bin" = "$build" ]; then
note "configure"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if timeout 120 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
     -DLOOM_BUILD_PYTHON=OFF -DLOOM_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$root/usr" >"$OUT/configure.txt" 2>&1; then
  tail -5 "$OUT/configure.txt"
  note "build (loom_test_backends_cuda, loom_test_core)"
  if [ -n "${LOOM_DEVICE_CHECK_CONFIGURE_ONLY:-}" ]; then
    echo "LOOM_DEVICE_CHECK_CONFIGURE_ONLY: stopping after configure (a check of this script on a CPU machine)"
    exit 0
  elif timeout 330 cmake --build "$build" -j"$(nproc)" --target loom_test_backends_cuda loom_test_core loom >"$OUT/build.txt" 2>&1; then
    build_status="built in $(elapsed)s"
  else
    build_status="build failed (see device_check.log)"
    grep -E "error|Error" "$OUT/build.txt" | head -40
  fi
  tail -3 "$OUT/build.txt"
else
  build_status="configure failed (see device_check.log)"
  tail -40 "$OUT/configure.txt"
fi
rm -f "$OUT/configure.txt" "$OUT/build.txt"
fi
note "$build_status"

if [ -x "$bin/tests/loom_test_backends_cuda" ]; then
  note "tests/backends/cuda"
  timeout 150 "$bin/tests/loom_test_backends_cuda" --gtest_output="json:$OUT/cuda_tests.json"
  echo "loom_test_backends_cuda exit $?"
  # The attention tests again on the one-warp-per-row kernels (the GEMM blocks are the default).
  LOOM_CUDA_ATTENTION=warp timeout 60 "$bin/tests/loom_test_backends_cuda" --gtest_filter='*Attention*' \
    >"$OUT/warp_attention.log" 2>&1
  echo "attention tests on the warp kernels: exit $?"; tail -3 "$OUT/warp_attention.log"
  note "tests/core: the allocator and step capture"
  timeout 60 "$bin/tests/loom_test_core" --gtest_filter='CachingAllocator.*:StepCapture.*' >"$OUT/core_tests.log" 2>&1
  echo "loom_test_core exit $?"; tail -3 "$OUT/core_tests.log"
  if [ -x "$bin/loom" ]; then
    note "loom bench train --device cuda"
    # bf16 GEMMs (f32 master weights), the seeds' models at their context lengths; each line time-boxed.
    # A Llama of GPT-2 small's size (115M: d 768, 12 layers, T 1024, vocab 32000) beside the seeds' presets.
    llama="--set model.d_model=768 --set model.num_layers=12 --set model.num_heads=12 --set model.context_length=1024 --set model.vocab_size=32000"
    benches=("gpt2-small|--batch 64 --bf16" "gpt2-small|--batch 16 --bf16" "gpt2-small|--batch 16"
             "cs336-tinystories|--batch 32 --bf16 $llama" "cs336-tinystories|--batch 64 --bf16"
             "dsv3-mini|--batch 32 --bf16")
    for spec in "${benches[@]}"; do
      preset=${spec%%|*} args=${spec#*|}
      if [ "$(elapsed)" -ge "${LOOM_DEVICE_CHECK_BENCH_UNTIL:-240}" ]; then echo "skipped $spec: out of time"; continue; fi
      # shellcheck disable=SC2086  # args is a list of words
      line=$(timeout 60 "$bin/loom" bench train --device cuda --preset "$preset" $args --steps 5 --warmup 2 2>&1 | tail -1)
      echo "$preset $args: $line"
      python3 -c 'import json, sys
try: result = json.loads(sys.argv[2])
except ValueError: result = sys.argv[2]
print(json.dumps({"run": sys.argv[1], "result": result}))' "$preset $args" "$line" >>"$OUT/bench.jsonl"
    done
  fi
  if [ -x "$bin/loom" ] && [ "$(elapsed)" -lt "${LOOM_DEVICE_CHECK_TRAIN_UNTIL:-300}" ]; then
    note "loom train --device cuda (GPT-2 small, bf16, on random tokens)"
    # The trainer's own loop on the GPU (batches copied over, validation, a checkpoint, the weights
    # written): its tokens/s beside bench train's. Random tokens in GPT-2's vocabulary, made here.
    data=$(mktemp -d)
    python3 - "$data" <<'TOKENS'
import array, json, random, sys
random.seed(1)
for name, n in (("train.bin", 2_000_000), ("val.bin", 200_000)):
    array.array("H", (random.randrange(50257) for _ in range(n))).tofile(open(f"{sys.argv[1]}/{name}", "wb"))
json.dump({"dtype": "uint16", "vocab_size": 50257}, open(f"{sys.argv[1]}/meta.json", "w"))
TOKENS
    timeout 120 "$bin/loom" train --config gpt2-small --device cuda --out "$data/run" \
      --set training.precision=bf16 --set training.batch_size=16 --set training.max_steps=60 \
      --set eval.interval=30 --set eval.batches=4 --set checkpoint.interval=60 --set logging.interval=20 \
      --set logging.progress=lines --set sample.num_samples=0 --set data.tokenizer="$data/none.json" \
      --set data.train="$data/train.bin" --set data.val="$data/val.bin" 2>&1 | tail -8
    echo "loom train exit ${PIPESTATUS[0]}"
    cp "$data/run/metrics.jsonl" "$OUT/train_gpu.jsonl" 2>/dev/null
    ls -la "$data/run/checkpoints/"* 2>/dev/null | tail -4
    rm -rf "$data"
  fi
  if command -v compute-sanitizer >/dev/null && [ "$(elapsed)" -lt "${LOOM_DEVICE_CHECK_SANITIZE_UNTIL:-300}" ]; then
    note "compute-sanitizer memcheck over the kernel tests"
    # Every kernel suite (not the allocator's OOM probe or graph capture, which the sanitizer perturbs, nor the
    # whole-model test, which repeats the op tests' kernels hundreds of times).
    timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/tests/loom_test_backends_cuda" \
      --gtest_filter='*:-CudaAllocator.*:CudaStepCapture.*:CudaRuntime.*:CudaDispatch.*:CudaCli.*:*CudaModel.*' \
      >"$OUT/sanitizer.log" 2>&1
    echo "compute-sanitizer exit $?"; tail -5 "$OUT/sanitizer.log"
  fi
fi

note "summary"
python3 - "$OUT" "$build_status" >"$summary" <<'PY'
import json, os, subprocess, sys
out, build_status = sys.argv[1], sys.argv[2]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:
        return f"({e})"
print("# tools/device_check.sh\n")
print(f"- GPU: {sh('nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader') or 'none seen'}")
print(f"- nvcc: {sh('nvcc --version | tail -1')}")
print(f"- build: {build_status}\n")
path = os.path.join(out, "cuda_tests.json")
if not os.path.exists(path):
    print("No test report: the CUDA tests did not run.")
    sys.exit(0)
report = json.load(open(path))
counts = {"passed": 0, "failed": 0, "skipped": 0}
print("| test | result | time |\n| --- | --- | --- |")
for suite in report.get("testsuites", []):
    for t in suite.get("testsuite", []):
        if t.get("failures"):
            result = "FAILED: " + t["failures"][0]["failure"].splitlines()[0][:120].replace("|", "/")
            counts["failed"] += 1
        elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
            result = "skipped"
            counts["skipped"] += 1
        else:
            result = "passed"
            counts["passed"] += 1
        print(f"| {suite['name']}.{t['name']} | {result} | {t.get('time', '')} |")
print(f"\n{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
bench = os.path.join(out, "bench.jsonl")
if os.path.exists(bench):
    print("\n| bench train --device cuda | tokens/s | ms/step | MFU (of the measured GEMM rate) | GPU peak MiB |")
    print("| --- | --- | --- | --- | --- |")
    for line in open(bench):
        row = json.loads(line)
        r = row["result"]
        if isinstance(r, dict):
            print(f"| {row['run']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | "
                  f"{100 * r['mfu']:.1f}% of {r['peak_gflops'] / 1e3:.0f} TFLOP/s | {r.get('device_peak_mib', -1):.0f} |")
        else:
            print(f"| {row['run']} | failed: {str(r)[:160].replace('|', '/')} | | | |")
    print("\nWhere a profiled step's time goes on the GPU (ms, forward + backward, largest first):\n")
    for line in open(bench):
        row = json.loads(line)
        r = row["result"]
        if isinstance(r, dict) and r.get("profile_ms"):
            top = sorted(r["profile_ms"].items(), key=lambda kv: -kv[1])[:10]
            print(f"- {row['run']}: total {sum(r['profile_ms'].values()):.1f}; " + ", ".join(f"{k} {v:.2f}" for k, v in top))
train = os.path.join(out, "train_gpu.jsonl")
if os.path.exists(train):
    print("\n`loom train --device cuda` (GPT-2 small, bf16, batch 16 x 1024, random tokens):\n")
    for line in open(train):
        e = json.loads(line)
        if e.get("event") == "train":
            print(f"- step {e['step']}: loss {e['loss']:.4f}, {e['tokens_per_s']:.0f} tokens/s, MFU {100 * e['mfu']:.1f}%")
        elif e.get("event") == "val":
            print(f"- step {e['step']}: validation loss {e['val_loss']:.4f}")
else:
    print("\n`loom train --device cuda` did not run (no metrics).")
PY
cat "$summary"
note "done"
