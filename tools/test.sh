#!/usr/bin/env bash
# The test command, on a fresh clone too: the setup when something is missing (tools/ensure_setup.sh),
# then builds what changed and runs every test suite through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure_setup.sh --tests
# The floors of docs/architecture.md: every #include in src/, cli/ and python/src/ points to its own floor
# or one below; then the check is shown to catch a planted upward, sibling and undeclared-folder include.
python3 tools/check_layers.py
python3 tools/check_layers.py --self-test
[ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
# The Python module is built in the same tree (build/python/loom), reusing the compiled library.
cmake -S . -B build -DLOOM_BUILD_PYTHON=ON >/dev/null
# Everything: the library, the CLI, the test suites, the benchmark programs and the Python module
# (tools/setup.sh, and so a fresh clone's first `./loom`, builds only the CLI).
cmake --build build -j"$(nproc)"
# The readers of untrusted files (safetensors headers, configs, tokenizer.json, GGUF) under libFuzzer with ASan
# and UBSan, 60 seconds in all (before CTest, so CTest's summary closes the log).
bash tools/fuzz.sh 60
# Tests run two at a time on 2 cores: OpenMP threads that spin while waiting would then steal each
# other's cores (a 10x slowdown measured here), so they sleep instead. Benchmarks do not set this.
export OMP_WAIT_POLICY=passive
# The Python suite (pytest) against the module just built.
PYTHONPATH="$PWD/build/python" python3 -m pytest -q -p no:cacheprovider python/tests
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
