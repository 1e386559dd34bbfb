#!/usr/bin/env python3
"""Tokens/s of `loom train` (the CLI) against loom.train (Python) on the same config, runs interleaved
so that load from other processes hits both alike. Usage (from the repo root, data prepared):

    PYTHONPATH=build/python python3 python/bench/train_overhead.py --cli build/loom --config tiny --repeats 3
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

import loom


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/loom")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="section.key=value, for both")
    args = ap.parse_args()
    sets = ["logging.progress=none", "sample.num_samples=0"] + args.set
    cli, py = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            cmd = [args.cli, "train", "--config", args.config, "--out", f"{tmp}/cli{i}"]
            for s in sets:
                cmd += ["--set", s]
            err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
            cli.append(float(re.search(r"([0-9.]+) tokens/s", err).group(1)))
            py.append(loom.train(args.config, f"{tmp}/py{i}", sets)["tokens_per_s"])
            print(f"run {i}: loom train {cli[-1]:.0f} tokens/s, loom.train {py[-1]:.0f} tokens/s", flush=True)
    print(f"median: loom train {statistics.median(cli):.0f} tokens/s, loom.train {statistics.median(py):.0f} "
          f"tokens/s (ratio {statistics.median(py) / statistics.median(cli):.3f})")


if __name__ == "__main__":
    sys.exit(main())
