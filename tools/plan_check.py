#!/usr/bin/env python3
"""`loom plan` against loom's own runs on this machine (docs/plan.md, "Against loom's own runs").

Runs build/bench/loom_bench_plan for each layout below, alone or under `mpirun -np N` (each rank bound
to a core, round robin), and prints one markdown row per pipeline stage: the bytes per collective kind the stage's ranks handed to
the communicator against the plan's (equal or not), each rank's allocator peak against the plan's memory
for its stage, and the step time against the plan's.

The plan's time needs the machine's speed. The FMA peak of one core is measured once (the first run's
`loom bench peak` loop, or --flops), and the fraction of it loom's step reaches (--efficiency) is
calibrated on the one-process run of each model (the median of three): its measured step over the plan's compute at
efficiency 1. The multi-rank runs then test the rest of the time model (the split of the work, the
bubble, the collectives) with that one number fixed. Measured beside it, from one-process runs too: the
share of the step in the op families a tensor axis leaves whole (`loom bench roofline`), and with more
ranks than cores what sharing the cores costs a process's compute (copies of the one-process step).

The collectives are charged what tools/measure_collectives.py measures them to cost on this machine,
by default measured first, in the same minutes as the runs (what a collective costs moves with the
machine's load as much as the step does); --collectives FILE uses a stored measurement (such as
docs/plan/cpu-collectives.json), --collectives none the ring formula.

Beside each step it prints all the ranks' CPU time over the cores against the plan's floor (the
plan's step is no shorter than it: docs/plan.md, "The cores"), and at the end how many layouts came
within 25%. The runs get the cores the kernel gives this session: while other sessions compute, fewer
than the machine's (--cores plans for a given number; --cores probe measures, before each layout, the
cores its ranks would get, with copies of the one-process step).

    python3 tools/plan_check.py [--steps 10] [--only pipe] [--json out.jsonl] [--collectives measure|FILE|none] [--cores 2|probe]
                                [--bench OTHER_BUILD/bench/loom_bench_plan] [--rounds N]

--rounds N runs every layout N times in turn (each round calibrated again) and ends with each layout's
rounds' step ratios and their median, counting the layouts whose median is within 25%: on a shared
machine one run's count moves with the minute it ran in.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "bench", "loom_bench_plan")
COSTS = os.path.join(ROOT, "docs", "plan", "cpu-collectives.json")
BENCH_USED = BENCH
LOOM = os.path.join(ROOT, "build", "loom")
# Each rank bound to a core, round robin (rank r on core r mod cores), several to a core where they
# outnumber the cores: Open MPI binds to cores by itself only up to 2 ranks and not at all under
# --oversubscribe, and unbound ranks are moved between the cores by the kernel's load balancer, each
# move leaving the caches behind (docs/plan.md, "Binding the ranks": 5-13% slower steps with 4 and 8
# ranks on 2 cores). The plan's equal shares of the cores are what bound ranks get.
MPI_BINDING = ["--map-by", "core:oversubscribe", "--bind-to", "core:overload-allowed"]

LLAMA = ["--config", "tiny", "--set", "model.num_layers=4", "--batch", "16"]
GPT2 = ["--config", "gpt2-small", "--set", "model.num_layers=4", "--set", "model.d_model=64", "--set",
        "model.num_heads=4", "--set", "model.vocab_size=512", "--set", "model.context_length=64", "--set",
        "model.dropout=0", "--batch", "16"]
DSV3 = ["--config", "dsv3-tiny", "--set", "model.num_layers=4", "--batch", "16"]

# (name, model args, ranks, layout args)
RUNS = [
    ("llama", LLAMA, 1, ["--micro", "1"]),
    ("llama", LLAMA, 1, ["--micro", "4"]),
    ("llama", LLAMA, 2, ["--mesh", "data=2", "--mode", "dp"]),
    ("llama", LLAMA, 2, ["--mesh", "data=2", "--mode", "fsdp"]),
    ("llama", LLAMA, 2, ["--mesh", "tensor=2", "--mode", "tp"]),
    ("llama", LLAMA, 4, ["--mesh", "data=2,tensor=2", "--mode", "fsdp_tp"]),
    ("llama", LLAMA, 4, ["--mesh", "data=4", "--mode", "fsdp"]),
    ("llama", LLAMA, 2, ["--mesh", "data=2", "--mode", "fsdp", "--recompute", "full"]),
    ("llama", LLAMA, 2, ["--mesh", "pipe=2", "--mode", "dp", "--schedule", "gpipe", "--micro", "4"]),
    ("llama", LLAMA, 2, ["--mesh", "pipe=2", "--mode", "dp", "--schedule", "1f1b", "--micro", "4"]),
    ("llama", LLAMA, 4, ["--mesh", "pipe=4", "--mode", "dp", "--schedule", "1f1b", "--micro", "8"]),
    ("llama", LLAMA, 4, ["--mesh", "pipe=4", "--mode", "dp", "--schedule", "gpipe", "--micro", "8"]),
    ("llama", LLAMA, 4, ["--mesh", "pipe=2,data=2", "--mode", "dp", "--schedule", "1f1b", "--micro", "4"]),
    ("llama", LLAMA, 4, ["--mesh", "pipe=2,data=2", "--mode", "fsdp", "--schedule", "gpipe", "--micro", "2"]),
    ("llama", LLAMA, 4, ["--mesh", "pipe=2,tensor=2", "--mode", "tp", "--schedule", "1f1b", "--micro", "4"]),
    ("llama", LLAMA, 2, ["--mesh", "pipe=2", "--mode", "dp", "--schedule", "1f1b", "--micro", "4", "--recompute", "full"]),
    ("llama", LLAMA, 2, ["--mesh", "pipe=2", "--mode", "dp", "--schedule", "gpipe", "--micro", "4", "--recompute", "selective"]),
    ("llama", LLAMA, 8, ["--mesh", "pipe=2,data=2,tensor=2", "--mode", "fsdp_tp", "--schedule", "1f1b", "--micro", "2"]),
    ("llama", LLAMA, 8, ["--mesh", "pipe=4,data=2", "--mode", "dp", "--schedule", "1f1b", "--micro", "4"]),
    ("gpt2", GPT2, 1, ["--micro", "1"]),
    ("gpt2", GPT2, 2, ["--mesh", "pipe=2", "--mode", "dp", "--schedule", "1f1b", "--micro", "4"]),
    ("gpt2", GPT2, 4, ["--mesh", "pipe=2,data=2", "--mode", "fsdp", "--schedule", "gpipe", "--micro", "2"]),
]


def run(model_args, ranks, layout, steps, flops, bandwidth, efficiency, collectives, cores, slowdown=None,
        replicated=None):
    cmd = [BENCH_USED] + model_args + layout + ["--steps", str(steps), "--cores", str(cores)]
    if slowdown:
        cmd += ["--shared-core-slowdown", repr(slowdown)]
    if replicated:
        cmd += ["--tensor-replicated-share", repr(replicated)]
    if collectives:
        cmd += ["--collectives", collectives]
    if flops:
        cmd += ["--flops", repr(flops), "--bandwidth", repr(bandwidth)]
    if efficiency:
        cmd += ["--efficiency-at", ",".join(f"{rows:g}:{e!r}" for rows, e in sorted(efficiency.items()))]
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root"] + MPI_BINDING + ["-np", str(ranks)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def one_process_copies(model_args, copies, steps=10, extra=()):
    """`copies` one-process steps run at once: each copy's measured line."""
    cmd = [BENCH_USED] + model_args + ["--micro", "1", "--steps", str(steps)] + list(extra)
    # Bound as mpirun binds a layout's ranks (MPI_BINDING): copy i on core i mod the machine's cores.
    cpus = sorted(os.sched_getaffinity(0))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              preexec_fn=lambda i=i: os.sched_setaffinity(0, {cpus[i % len(cpus)]}))
             for i in range(copies)]
    measured = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}")
        measured.append(json.loads(next(line for line in out.splitlines() if line.startswith("{")))["measured"])
    return measured


# The op families a tensor axis leaves whole: every tensor rank runs them over its tokens' whole
# activations (the norms, the residual adds and other elementwise ops, the embedding, the sums of
# gradients that meet); the rest (the GEMMs, attention, SwiGLU, the head) splits or is counted whole.
REPLICATED_FAMILIES = ("norm", "elementwise", "embedding", "autograd (gradient sums)")


def tensor_replicated_share(model_args, steps):
    """The one-process step's share in REPLICATED_FAMILIES, by `loom bench roofline`'s per-op timer on one
    thread (DeviceSpec::tensor_replicated_share)."""
    args = ["--preset" if x == "--config" else x for x in model_args]
    with tempfile.TemporaryDirectory() as out:
        cmd = [LOOM, "bench", "roofline"] + args + ["--threads", "1", "--steps", str(steps), "--out", out]
        got = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if got.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{got.stdout}\n{got.stderr}")
        with open(os.path.join(out, "roofline.json")) as f:
            report = json.load(f)
    families = {f["family"]: f["seconds"] for f in report["families"]}
    return sum(families.get(k, 0.0) for k in REPLICATED_FAMILIES) / sum(families.values())


def probe_cores(model_args, copies):
    """The cores this session gets now: `copies` one-process steps at once, their CPU over their wall time
    (the kernel shares the cores between sessions: while another session computes, fewer than the
    machine's)."""
    measured = one_process_copies(model_args, copies)
    cpu = sum(m["cpu_s"] for m in measured)
    wall = max(m["step_s"] for m in measured)
    return max(0.25, min(float(copies), cpu / wall))


def shared_core_slowdown(model_args, copies, steps, flops, bandwidth, alone_cpu):
    """What sharing the cores costs a rank's compute: `copies` one-process steps at once on this session's
    cores (as many as a layout's ranks), the median of their CPU time a step over one step's alone
    (`alone_cpu`, the calibration's). Each switch between processes leaves the caches cold for the one
    that comes back; the copies switch at the kernel's time slices, ranks also at every wait, so this is
    the part of the cost that does not depend on the layout."""
    measured = one_process_copies(model_args, copies, steps, ["--flops", repr(flops), "--bandwidth", repr(bandwidth)])
    return statistics.median(m["cpu_s"] for m in measured) / alone_cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="run only layouts whose arguments contain this text")
    ap.add_argument("--flops", type=float, default=0, help="one core's f32 FLOP/s (default: measured once)")
    ap.add_argument("--bandwidth", type=float, default=0, help="read bandwidth, bytes/s (default: measured once)")
    ap.add_argument("--json", default="", help="also write every rank's line here")
    ap.add_argument("--bench", default=BENCH, help="the loom_bench_plan binary (another build's, for back-to-back runs)")
    ap.add_argument("--cores", default=str(os.cpu_count() or 1),
                    help="the cores the runs have (default: the machine's; the kernel shares them between sessions, "
                         "so while another session computes a run gets fewer), or 'probe': before each layout, "
                         "as many copies of the one-process step as the layout has ranks (at most the machine's "
                         "cores) run at once, and their CPU over their wall time is the cores the layout is planned for")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every layout this many times in turn (each round calibrated again) and judge each "
                         "layout by the median of its rounds' step ratios: this machine's speed moves by 25%% "
                         "between minutes, so one run's count says little")
    ap.add_argument("--collectives", default="measure",
                    help="the collective costs the plan charges: 'measure' (default: tools/measure_collectives.py "
                         "first, at this moment's load, into a temporary file), a file such as " + COSTS +
                         ", or 'none' (the ring formula)")
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit(f"--rounds {a.rounds}: must be at least 1")
    global BENCH_USED
    BENCH_USED = a.bench
    collectives = "" if a.collectives == "none" else a.collectives
    if collectives == "measure":
        collectives = os.path.join(tempfile.mkdtemp(), "cpu-collectives.json")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "measure_collectives.py"), "--out", collectives],
                       check=True, stdout=subprocess.DEVNULL)
    if collectives and not os.path.exists(collectives):
        sys.exit(f"{collectives} is missing: python3 tools/measure_collectives.py (or --collectives none)")
    print(f"collective costs: {collectives or 'none (the ring formula)'}")
    if not os.path.exists(BENCH_USED):
        sys.exit(f"{BENCH_USED} is missing: cmake --build build --target loom_bench_plan")
    if not os.path.exists(LOOM):
        sys.exit(f"{LOOM} is missing (it measures the families a tensor axis leaves whole): cmake --build build --target loom")
    print(f"load average before: {os.getloadavg()}", flush=True)
    flops, bandwidth = a.flops, a.bandwidth
    lines = []
    print("| model | ranks | layout | stage | bytes/step/rank: measured = plan | allocator peak (max over the stage's ranks) | plan | ratio "
          "| step measured | plan | ratio | measured: outside + blocked in collectives | plan: compute, bubble, AdamW + exposed communication "
          "| calls/step: measured / plan | all ranks' CPU over the cores: measured / plan "
          "| of the measured: compute threads outside collectives, inside them, communication threads |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    machine_cores = float(os.cpu_count() or 1)
    probe = a.cores == "probe"
    cores = machine_cores if probe else float(a.cores)
    by_layout = {}  # (model, ranks, layout) -> each round's measured / planned step
    for round_ in range(a.rounds):
        if a.rounds > 1:
            print(f"<!-- round {round_ + 1} of {a.rounds}, load average {os.getloadavg()[0]:.2f} -->", flush=True)
        flops, bandwidth = one_round(a, collectives, cores, machine_cores, probe, flops, bandwidth, lines, by_layout)
    print(f"load average after: {os.getloadavg()}")
    ratios = {k: sorted(v) for k, v in by_layout.items()}
    medians = {k: statistics.median(v) for k, v in ratios.items()}
    close = {k: max(m, 1 / m) <= 1.25 for k, m in medians.items()}  # within 25%, either way
    within = sum(close.values())
    if a.rounds > 1:
        print("| model | ranks | layout | step measured / plan, each round (sorted) | median | within 25% |")
        print("|---|---|---|---|---|---|")
        for (name, ranks, desc), v in ratios.items():
            k = (name, ranks, desc)
            print(f"| {name} | {ranks} | {desc} | {', '.join(f'{x:.2f}' for x in v)} | {medians[k]:.2f} | "
                  f"{'yes' if close[k] else 'no'} |")
        print(f"within 25% by the median of {a.rounds} rounds: {within} of {len(medians)} layouts")
    else:
        print(f"within 25%: {within} of {len(medians)} layouts (step, the slowest stage's ranks)")
    if a.json:
        with open(a.json, "w") as f:
            for r in lines:
                f.write(json.dumps(r) + "\n")


def one_round(a, collectives, cores, machine_cores, probe, flops, bandwidth, lines, by_layout):
    """Every layout once (the one-process runs first calibrate the efficiency): prints its rows, appends
    each rank's line to `lines` and each layout's measured / planned step to by_layout."""
    efficiency = {}
    alone_cpu = {}  # model -> the calibration's CPU a step, one process alone
    slowdowns = {}  # (model, ranks) -> shared_core_slowdown, where the ranks outnumber the cores
    replicated = {}  # model -> tensor_replicated_share
    for name, model_args, ranks, layout in RUNS:
        if a.only and a.only not in " ".join(layout) and ranks > 1:
            continue
        calibrate = ranks == 1 and layout == ["--micro", "1"]
        if probe:
            cores = probe_cores(model_args, min(ranks, int(machine_cores))) if ranks > 1 else machine_cores
        slowdown = None
        if ranks > cores and name in alone_cpu:
            if (name, ranks) not in slowdowns:
                slowdowns[(name, ranks)] = shared_core_slowdown(model_args, ranks, a.steps, flops, bandwidth, alone_cpu[name])
                print(f"<!-- {name}: {ranks} copies of the one-process step on {cores:g} cores took "
                      f"{slowdowns[(name, ranks)]:.3f}x its CPU a step alone (the plan's shared-core slowdown) -->",
                      flush=True)
            slowdown = slowdowns[(name, ranks)]
        got = run(model_args, ranks, layout, a.steps, flops, bandwidth, None if calibrate else efficiency.get(name),
                  collectives, cores, slowdown, replicated.get(name))
        if calibrate:
            # The one number every later row leans on: the median of three runs, not one (a moment of
            # another session's work in one run moved every prediction of a table by 15%).
            flops = flops or got[0]["device"]["f32_flops"]
            bandwidth = bandwidth or got[0]["device"]["memory_bandwidth"]
            runs = [got] + [run(model_args, ranks, layout, a.steps, flops, bandwidth, None, collectives, cores)
                            for _ in range(2)]
            got = sorted(runs, key=lambda g: g[0]["measured"]["step_s"])[1]
        if calibrate:
            # The plan's compute at efficiency e is compute_s; the step is compute + optimizer (no
            # communication): e = (compute_s * e0) / (measured - optimizer_s). Measured at three heights
            # of a micro-batch, the batch's 1024 tokens whole and in 4 and 8 micro-batches (256 and 128
            # rows, what the layouts' micro-batches give a rank), each the median of three: the plan
            # interpolates between them (DeviceSpec::efficiency_by_rows). The batch is split, not shrunk
            # (as until 2026-12-05: steps of 4 and 2 sequences), so that what a rank pays per micro-batch
            # (the gradients accumulated, the loss, each op's fixed cost) is in the number: on an Intel
            # Xeon, 8 micro-batches of 2 sequences reached 0.432 of the peak against the whole batch's
            # 0.479, where a step of 2 sequences alone had reached 0.536 against 0.504.
            def efficiency_of(r):
                e0 = r["device"]["gemm_efficiency"]
                return r["plan"]["compute_s"] * e0 / (r["measured"]["step_s"] - r["plan"]["optimizer_s"])
            r = got[0]
            flops = flops or r["device"]["f32_flops"]
            bandwidth = bandwidth or r["device"]["memory_bandwidth"]
            heights = {r["batch"] * r["seq"]: efficiency_of(r)}
            for micro in (4, 8):
                runs_micro = sorted((run(model_args, 1, ["--micro", str(micro)], a.steps, flops, bandwidth, None,
                                         collectives, cores) for _ in range(3)),
                                    key=lambda g: g[0]["measured"]["step_s"])
                rs = runs_micro[1][0]
                heights[rs["batch"] * rs["seq"] / rs["micro"]] = efficiency_of(rs)
            efficiency[name] = heights
            alone_cpu[name] = r["measured"]["cpu_s"]
            replicated[name] = tensor_replicated_share(model_args, a.steps)
            print(f"<!-- {name}: {replicated[name]:.3f} of the one-process step in the families a tensor axis "
                  f"leaves whole ({', '.join(REPLICATED_FAMILIES)}; loom bench roofline) -->", flush=True)
            # The share of a core the calibrating process got (its CPU time over its wall time): below ~0.9
            # another session's work shared the core, and the multi-rank rows of this run get less than
            # the cores the plan gives them (docs/plan.md, "What the model still misses").
            share = r["measured"]["cpu_s"] / r["measured"]["step_s"]
            print(f"<!-- {name}: one core {flops / 1e9:.2f} GFLOP/s, loom's step reaches "
                  f"{', '.join(f'{e:.3f} at {rows:g} rows' for rows, e in sorted(heights.items()))} of it; "
                  f"the calibrating process had {share:.2f} of a core -->", flush=True)
        lines += got
        stages = sorted({r["stage"] for r in got})
        for s in stages:
            rs = [r for r in got if r["stage"] == s]
            kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
            equal = all(abs(r["measured"][k] - r["plan"][k]) < 0.5 for r in rs for k in kinds)
            total = rs[0]["measured"]
            byte_text = ", ".join(f"{k} {total[k]:,.0f}" for k in kinds if total[k] > 0) or "none"
            byte_text += " (equal)" if equal else " (DIFFER: plan " + ", ".join(
                f"{k} {rs[0]['plan'][k]:,.0f}" for k in kinds if rs[0]["plan"][k] > 0) + ")"
            peak = max(r["measured"]["peak"] for r in rs)
            plan_peak = rs[0]["plan"]["peak"]
            step = max(r["measured"]["step_s"] for r in rs)
            plan_step = rs[0]["plan"]["step_s"]
            desc = " ".join(layout)
            time_text = (f"{1e3 * plan_step:.1f} ms | {step / plan_step:.2f}" if not calibrate
                         else f"calibrates the efficiency: {max(efficiency[name].items())[1]:.3f} | 1 by definition")
            slowest = max(rs, key=lambda r: r["measured"]["step_s"])
            # Every rank's CPU over the cores (the floor the plan puts under the step where ranks share
            # cores): measured from the processes' CPU time, planned as the stage's cpu_bound_s.
            cpu_measured = sum(r["measured"]["cpu_s"] for r in got) / min(cores, ranks)
            # Where that CPU went (summed over the ranks, over the cores as above): the compute threads
            # outside collectives (the model's compute and AdamW), inside them (polling, naps' wake-ups,
            # copies: CommStats::wait_cpu_seconds), and the communication threads (process less compute thread).
            split = [sum(f(r["measured"]) for r in got) / min(cores, ranks) for f in (
                lambda m: m["main_thread_cpu_s"] - m["wait_cpu_s"], lambda m: m["wait_cpu_s"],
                lambda m: max(0.0, m["cpu_s"] - m["main_thread_cpu_s"]))]
            # One-process rows beside the calibration (--micro 4 is one of its heights) check nothing.
            if s == stages[-1] and ranks > 1:
                by_layout.setdefault((name, ranks, desc), []).append(step / plan_step)
            wait = slowest["measured"]["wait_s"]
            p = slowest["plan"]
            print(f"| {name} | {ranks} | {desc} | {s} | {byte_text} | {peak:,.0f} | {plan_peak:,.0f} | {peak / plan_peak:.3f} "
                  f"| {1e3 * step:.1f} ms | {time_text} | {1e3 * (step - wait):.1f} + {1e3 * wait:.1f} ms "
                  f"| {1e3 * (p['compute_s'] + p['bubble_s'] + p['optimizer_s']):.1f} + {1e3 * p['exposed_comm_s']:.1f} ms "
                  f"| {slowest['measured']['calls']:.0f} / {p['calls']:.0f} "
                  f"| {1e3 * cpu_measured:.1f} / {1e3 * p.get('cpu_bound_s', 0):.1f} ms "
                  f"| {' + '.join(f'{1e3 * x:.1f}' for x in split)} ms |"
                  + (f" planned for {cores:.2f} cores |" if probe else ""),
                  flush=True)
    return flops, bandwidth


if __name__ == "__main__":
    main()
