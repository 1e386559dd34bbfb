#!/usr/bin/env python3
"""GPT-2 encoding, loom vs tiktoken (PyPI, Rust core), whole process included, same text and threads.

Each side is a fresh process that loads GPT-2's vocabulary from data/gpt2, reads the file and encodes
it: `loom tokenizer encode` (which also prints every id) vs bench/tokenizer/tiktoken_encode.py (which
prints only the count, in tiktoken's favour). Runs are interleaved; the table shows the median wall
time and the median CPU time (user + sys) of each, and the ratio tiktoken / loom (> 1: loom is
faster). It first checks that both give identical ids on the whole text.

usage (from the repository root, after building `loom`):
  python3 bench/tokenizer/encode_vs_tiktoken.py [--corpus data/bench/austen.txt] [--runs 5]
Needs: pip install tiktoken.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, stdout=subprocess.DEVNULL):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=stdout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="data/bench/austen.txt")
    ap.add_argument("--gpt2", default="data/gpt2")
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if not os.path.exists(args.corpus):
        subprocess.run([sys.executable, os.path.join(HERE, "austen_corpus.py"), args.corpus], check=True)
    tiktoken_cmd = [sys.executable, os.path.join(HERE, "tiktoken_encode.py"), args.gpt2, args.corpus]
    loom_cmd = [args.loom, "tokenizer", "encode", "--tokenizer", args.gpt2, "--input", args.corpus]

    ours = subprocess.run(loom_cmd + ["--threads", "1"], check=True, capture_output=True).stdout.split()
    theirs = subprocess.run(tiktoken_cmd + ["1", "--print"], check=True, capture_output=True).stdout.split()
    if ours != theirs:
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b) if len(ours) == len(theirs) else -1
        sys.exit(f"ids differ (loom {len(ours)} ids, tiktoken {len(theirs)}; first difference at {first})")
    size = os.path.getsize(args.corpus)
    print(f"{args.corpus}: {size / 1e6:.2f} MB, {len(ours)} GPT-2 tokens, identical ids from loom and tiktoken")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'threads':>7} | {'loom wall':>9} {'cpu':>7} | {'tiktoken wall':>13} {'cpu':>7} | {'wall ratio':>10} {'cpu ratio':>9}")
    for threads in (1, 2):
        lw, lc, tw, tc = [], [], [], []
        for _ in range(args.runs):
            w, c = run(loom_cmd + ["--threads", str(threads)])
            lw.append(w)
            lc.append(c)
            w, c = run(tiktoken_cmd + [str(threads)])
            tw.append(w)
            tc.append(c)
        m = statistics.median
        print(f"{threads:>7} | {m(lw):8.3f}s {m(lc):6.3f}s | {m(tw):12.3f}s {m(tc):6.3f}s | "
              f"{m(tw) / m(lw):9.2f}x {m(tc) / m(lc):8.2f}x")
    print("tiktoken's encode call alone (for loom's, see build/bench/loom_bench_tokenizer BM_EncodeGpt2):")
    subprocess.run(tiktoken_cmd + ["1", "--time"], check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
