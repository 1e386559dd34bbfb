#!/usr/bin/env bash
# The CUDA backend's check on a lent GPU (docs/cuda.md), in two halves:
#
#   tools/device_check.sh prepare   # here, on a CPU machine with apt: fetches what the GPU machine
#                                   # lacks into build-device/ (git-ignored), ~10 MB
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
# Every step is time-boxed so the whole run ends inside 9 minutes and the summary is always written.
# LOOM_DEVICE_CHECK_CONFIGURE_ONLY=1 stops `run` after CMake has configured against the unpacked
# packages: how this script itself is checked on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
bundle=build-device

# Debian packages loom builds against (tools/setup.sh's list, less what a CUDA image has).
debs=(libdnnl-dev libdnnl2 ocl-icd-libopencl1 nlohmann-json3-dev libcli11-dev
      libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
      libgtest-dev libgmock-dev zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3 pkg-config)

if [ "$mode" = prepare ]; then
  set -e
  rm -rf "$bundle"  # only the packages travel (the device tool's carry limit is 64 MiB)
  mkdir -p "$bundle/debs"
  [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update -qq
  (cd "$bundle/debs" && apt-get download "${debs[@]}")
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
nproc

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

note "configure"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
build="$bundle/build"
if timeout 120 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
     -DLOOM_BUILD_PYTHON=OFF -DLOOM_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$root/usr" >"$OUT/configure.txt" 2>&1; then
  tail -5 "$OUT/configure.txt"
  note "build (loom_test_backends_cuda, loom_test_core)"
  if [ -n "${LOOM_DEVICE_CHECK_CONFIGURE_ONLY:-}" ]; then
    echo "LOOM_DEVICE_CHECK_CONFIGURE_ONLY: stopping after configure (a check of this script on a CPU machine)"
    exit 0
  elif timeout 330 cmake --build "$build" -j"$(nproc)" --target loom_test_backends_cuda loom_test_core >"$OUT/build.txt" 2>&1; then
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
note "$build_status"

if [ -x "$build/tests/loom_test_backends_cuda" ]; then
  note "tests/backends/cuda"
  timeout 150 "$build/tests/loom_test_backends_cuda" --gtest_output="json:$OUT/cuda_tests.json"
  echo "loom_test_backends_cuda exit $?"
  note "tests/core: the allocator and step capture"
  timeout 60 "$build/tests/loom_test_core" --gtest_filter='CachingAllocator.*:StepCapture.*' >"$OUT/core_tests.log" 2>&1
  echo "loom_test_core exit $?"; tail -3 "$OUT/core_tests.log"
  if command -v compute-sanitizer >/dev/null && [ "$(elapsed)" -lt 400 ]; then
    note "compute-sanitizer memcheck over the kernel tests"
    # Every kernel suite (not the allocator's OOM probe or graph capture, which the sanitizer perturbs, nor the
    # whole-model test, which repeats the op tests' kernels hundreds of times).
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/loom_test_backends_cuda" \
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
print("\nNot run yet (the trainer, checkpoints and decoding do not take CUDA tensors, MoE routing has no "
      "kernel; docs/cuda.md): `loom train` runs and `loom bench train` on GPT-2 small / Llama / dsv3-mini. "
      "CudaModel.* above is the models' training step on the GPU against the CPU.")
PY
cat "$summary"
note "done"
