#!/usr/bin/env bash
# Makes the PyTorch 2.x peer for the benchmarks: a venv in DIR with PyPI's torch (and numpy), so that
# bench/pytorch_train.py --compile [--bf16] runs as a user choosing PyTorch today would run it.
#
#   tools/peer_venv.sh DIR            # e.g. tools/peer_venv.sh /tmp/torch2venv; then
#   DIR/bin/python bench/pytorch_train.py --preset cs336-tinystories --compile
#   TORCH_PY=DIR/bin/python tools/bench_readme.sh
#
# What it costs (measured 2026-12-01 on this workplace's machine): PyPI's only Linux x86-64 wheel of
# torch 2.15 is the CUDA build, a 539 MB wheel that depends on ~4 GB of NVIDIA CUDA packages; the venv
# takes 5.4 GB and ~1-2 minutes to install from a nearby mirror. The CUDA libraries are needed even on
# a CPU-only machine: `import torch` fails without them (libcufile.so.0), so `--no-deps` is no way out.
# A CPU-only wheel exists only on PyTorch's own package index, which this workplace cannot reach.
#
# torch.compile's default (inductor) backend generates C++ and compiles it with the system's C++
# compiler at run time, so the machine needs g++ (build-essential, which tools/setup.sh installs).
#
# TORCH_SPEC picks the version (default: the newest torch on PyPI), e.g. TORCH_SPEC='torch==2.15.0'.
# Safe to run again: an existing venv whose torch imports is kept.
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 DIR   (a venv with PyPI's PyTorch 2.x is made in DIR)" >&2
  exit 2
fi
dir=$1
spec=${TORCH_SPEC:-torch}
python=${PYTHON:-python3}

if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import torch" 2>/dev/null; then
  echo "$dir already has torch $("$dir/bin/python" -c 'import torch; print(torch.__version__)')" >&2
else
  command -v "$python" >/dev/null || { echo "$0: no $python on PATH" >&2; exit 1; }
  start=$(date +%s)
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q "$spec" numpy
  echo "installed $spec into $dir in $(( $(date +%s) - start )) s; the venv takes $(du -sh "$dir" | cut -f1)" >&2
fi
if ! command -v "${CXX:-c++}" >/dev/null; then
  echo "warning: no C++ compiler (${CXX:-c++}) on PATH: torch.compile (--compile) will fail; install g++" >&2
fi
"$dir/bin/python" -c "import torch; print('torch', torch.__version__, 'cpu capability', torch.backends.cpu.get_cpu_capability())"
