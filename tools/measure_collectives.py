#!/usr/bin/env python3
"""This CPU's network, measured: what each collective costs a step through loom's communicator.

Runs build/bench/loom_bench_collectives under `mpirun -np R` (ranks bound to cores round robin, as
tools/plan_check.py binds them) for the rank counts and
group sizes loom's own runs use on this machine (tools/plan_check.py), and writes the seconds per call
of each kind, group, rank count and gap at each payload (the planner interpolates between them) into
the data file `loom plan --device cpu --collectives FILE` and bench/plan.cpp read (docs/plan.md, "The
network of this CPU"), saying when, by which command and at what load it was measured.

    python3 tools/measure_collectives.py [--out docs/plan/cpu-collectives.json] [--calls 10] [--reps 5] [--gaps-us 100,400]
                                         [--gap-bytes 4194304]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "bench", "loom_bench_collectives")
# (ranks, group): the groups loom's runs here use: an axis of 2 among 2, 4 or 8 ranks, the world of 4 and 8.
RUNS = [(2, 2), (4, 2), (4, 4), (8, 2), (8, 8)]
# What the planner charges from the measurement (src/plan/plan.cpp): blocking all-reduces and all-gathers,
# and collectives started in the background (FSDP's gathers and reduce-scatters, the gradient buckets).
# and a pipeline's messages (send_recv: their CPU; the wait for them is the bubble's).
KINDS = "all_reduce,all_gather,started_all_gather,send_recv"
BYTES = [8, 16384, 131072, 1048576]


def dump(doc):
    """The document with one line per cost entry (readable, and a diff shows which entries moved)."""
    head = {k: v for k, v in doc.items() if k != "costs"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "costs": [\n'
    text += ",\n".join("  " + json.dumps(c) for c in doc["costs"])
    return text + "\n ]\n}\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "plan", "cpu-collectives.json"))
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gaps-us", default="100,400", help="compute between calls, microseconds of one core's CPU time")
    ap.add_argument("--gap-bytes", type=int, default=4 << 20,
                    help="the working set each gap walks (default 4 MiB, more than a core's L2): with more ranks than "
                         "cores every wait hands the core to another rank, and the rank that comes back finds its "
                         "data gone from the caches; the CPU a call takes counts that refill (0: the gap in registers)")
    ap.add_argument("--raw", default="", help="also write the benchmark's lines here")
    a = ap.parse_args()
    if not 0 <= a.gap_bytes <= 1 << 32:
        sys.exit(f"--gap-bytes {a.gap_bytes}: must be in [0, 2^32]")
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} is missing: cmake --build build --target loom_bench_collectives")
    load_before = os.getloadavg()
    lines = []
    for ranks, group in RUNS:
        cmd = ["mpirun", "--allow-run-as-root", "--map-by", "core:oversubscribe", "--bind-to", "core:overload-allowed",
               "-np", str(ranks), BENCH, "--group", str(group),
               "--calls", str(a.calls), "--reps", str(a.reps), "--gaps-us", a.gaps_us, "--gap-bytes", str(a.gap_bytes), "--kinds", KINDS, "--bytes", ",".join(map(str, BYTES))]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
        got = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        lines += got
        for r in got:
            print(f"ranks {ranks} group {group} {r['kind']:>18} {r['bytes']:>8} B, gap {r['gap_us']} us: "
                  f"{1e6 * r['per_call_s']:8.1f} us/call, {1e6 * r['cpu_per_call_s']:8.1f} us CPU/call", flush=True)
    load_after = os.getloadavg()
    costs = []
    for ranks, group in RUNS:
        for kind in sorted({r["kind"] for r in lines}):
            for gap in sorted({r["gap_us"] for r in lines}):
                rows = [r for r in lines
                        if r["ranks"] == ranks and r["group"] == group and r["kind"] == kind and r["gap_us"] == gap]
                if not rows:
                    continue
                pts = sorted((r["bytes"], r["per_call_s"]) for r in rows)
                # The CPU a call takes, with the slowdown of the gap that follows it (its working set
                # refetched after the switches the call caused; the same as cpu_per_call_s with a core per
                # rank or a gap in registers).
                cpu = sorted((r["bytes"], r["cpu_with_gaps_per_call_s"]) for r in rows)
                # The gap as the step meets it: the wall time of the compute alone, with the ranks sharing
                # the cores (the planner compares it with its compute per call).
                walls = sorted(r["gap_alone_s"] for r in rows)
                wall = walls[len(walls) // 2]
                if kind == "send_recv":  # a call of the benchmark is a message each way, one after the other
                    pts = [(b, s / 2) for b, s in pts]
                    cpu = [(b, s / 2) for b, s in cpu]
                costs.append({"kind": kind, "group": group, "ranks": ranks, "gap_s": round(wall, 9), "gap_cpu_s": round(gap * 1e-6, 9),
                              "points": [[b, round(s, 9)] for b, s in pts],
                              "cpu_points": [[b, round(s, 9)] for b, s in cpu]})
    doc = {
        "what": "what one collective call adds to a training step on this machine, through loom's communicator "
                "(bench/collectives.cpp): per kind, group, ranks on the machine and compute between calls (gap_s), "
                "[bytes as CommStats counts them, seconds per call] (points) and the CPU seconds a call takes, the ranks' mean "
                "(cpu_points); send_recv per message; started_all_gather "
                "the part a compute of gap_s did not hide (src/plan/devices.h, CollectiveCost)",
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python3 tools/measure_collectives.py --calls {a.calls} --reps {a.reps} --gaps-us {a.gaps_us} --gap-bytes {a.gap_bytes}",
        "machine": f"{os.cpu_count()} cores, " + open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "costs": costs,
    }
    # Written beside it and renamed over it: an interrupted write leaves the last measurement whole.
    with open(a.out + ".tmp", "w") as f:
        f.write(dump(doc))
    os.replace(a.out + ".tmp", a.out)
    print(f"wrote {a.out}")
    if a.raw:
        with open(a.raw, "w") as f:
            for r in lines:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
