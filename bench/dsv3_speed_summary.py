#!/usr/bin/env python3
"""Summarises bench/dsv3_speed.sh's result lines ("LABEL | load A B C | JSON | cpu_s=X"): per label the
median wall ms/step and tokens/s over its runs, the median CPU ms/step, and the MoE/dense ratios.

    python3 bench/dsv3_speed_summary.py bench-dsv3-results.txt --steps 3

CPU ms/step: the Python benchmarks measure it per step themselves (cpu_ms_per_step); for loom it is
(process CPU time - the same config's 1-step baseline run's) / steps, as a loom run makes steps + 1
steps (one untimed) and the baseline one.
"""
import argparse
import json
import statistics
import sys


def parse(path):
    runs = {}
    for line in open(path):
        if line.startswith("#") or " | " not in line:
            continue
        label, load, js, cpu = (p.strip() for p in line.split(" | "))
        try:
            j = json.loads(js)
        except json.JSONDecodeError:
            print(f"{path}: {label}: no JSON result ({js[:80]!r}); skipped", file=sys.stderr)
            continue
        j["load"] = [float(x) for x in load.split()[1:]]
        j["cpu_s"] = float(cpu.split("=")[1])
        runs.setdefault(label, []).append(j)
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    runs = parse(args.results)
    rows = {}
    for label, rs in runs.items():
        if label.endswith("-baseline"):
            continue
        wall = statistics.median(r.get("median_ms_per_step", r["ms_per_step"]) for r in rs)
        mean_wall = statistics.median(r["ms_per_step"] for r in rs)
        if "cpu_ms_per_step" in rs[0]:
            cpu = statistics.median(r["cpu_ms_per_step"] for r in rs)
        else:
            base = runs.get(label + "-baseline")  # f32 baselines only: bf16 loom runs get no CPU figure
            cpu = (statistics.median(r["cpu_s"] for r in rs) - base[0]["cpu_s"]) * 1e3 / args.steps if base else None
        tokens = rs[0].get("batch", 8) * rs[0].get("seq", 256)
        rows[label] = dict(n=len(rs), wall=mean_wall, wall_step_median=wall, tps=tokens * 1e3 / mean_wall, cpu=cpu,
                           load=statistics.median(r["load"][0] for r in rs), params=rs[0].get("params"),
                           precision=rs[0].get("precision"), compile_s=rs[0].get("compile_s"))
    fmt = "| {label} | {precision} | {n} | {wall:.0f} | {tps:.0f} | {cpu} | {load:.1f} |"
    print("| run | precision | runs | ms/step (median) | tokens/s | CPU ms/step | load avg (1 min) |")
    print("|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        print(fmt.format(label=label, **{**r, "cpu": "-" if r["cpu"] is None else f"{r['cpu']:.0f}"}))
    for num, den in (("loom", "dense"), ("loom", "llama"), ("loom-bf16", "dense-bf16"), ("pytorch", "loom"),
                     ("jax-seed", "loom"), ("pytorch-bf16", "loom-bf16"), ("jax-seed-bf16", "loom-bf16")):
        if num in rows and den in rows:
            w = rows[num]["wall"] / rows[den]["wall"]
            c = (rows[num]["cpu"] / rows[den]["cpu"]) if rows[num]["cpu"] and rows[den]["cpu"] else float("nan")
            print(f"{num} / {den}: wall {w:.2f}x, CPU {c:.2f}x")
    # The interleaved pairs: ratio per repetition, then the median.
    for num, den in (("loom", "dense"), ("loom", "llama")):
        if num in runs and den in runs:
            per = [a["ms_per_step"] / b["ms_per_step"] for a, b in zip(runs[num], runs[den])]
            print(f"{num} / {den} per repetition: {', '.join(f'{x:.2f}' for x in per)} (median {statistics.median(per):.2f})")


if __name__ == "__main__":
    main()
