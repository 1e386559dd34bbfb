#!/usr/bin/env python3
"""Turns tools/bench_readme.sh's result file into the README's Markdown: the CPU and FMA-peak lines, then
one table per preset with tokens/s, ms/step, model GFLOP/s, MFU, peak RSS and loom's lead.

    python3 bench/bench_readme_summary.py bench-results.txt

Lines it reads: "# DATE CPU...", "peak: JSON", "peak (end): JSON", and per run
"PRESET | VARIANT | round R | load A B C | WALL s | JSON or 'did not finish N steps (W warm-up) in M s'".
MFU is model FLOP/s (PaLM's 6N + 12*L*d*T per token, as each benchmark prints it; bench/pytorch_dsv3.py
prints none, so the dsv3 rows use loom's figure for the same model) over the median of every FMA peak the
run measured (`loom bench peak` at the start and the end, and the one each loom row measures after its
steps). A ratio is taken within one round (neighbouring runs) and given as the range over rounds.
"""
import json
import re
import statistics
import sys

ORDER = ["loom f32", "pytorch2 compile f32", "pytorch2 eager f32", "pytorch1 eager f32", "loom bf16",
         "pytorch2 compile bf16", "pytorch2 eager bf16", "pytorch1 eager bf16"]
NAMES = {"loom f32": "loom f32", "loom bf16": "loom `--bf16`",
         "pytorch2 compile f32": "PyTorch {v2} `torch.compile` f32",
         "pytorch2 eager f32": "PyTorch {v2} eager f32",
         "pytorch1 eager f32": "PyTorch {v1} eager f32",
         "pytorch2 compile bf16": "PyTorch {v2} `torch.compile` + bf16 autocast",
         "pytorch2 eager bf16": "PyTorch {v2} eager + bf16 autocast",
         "pytorch1 eager bf16": "PyTorch {v1} eager + bf16 autocast"}
DNF = re.compile(r"did not finish (\d+) steps \((\d+) warm-up\) in (\d+) s")


def num(x, digits=0):
    return f"{x:,.{digits}f}"


def span(values, digits=0, suffix=""):
    lo, hi = min(values), max(values)
    if num(lo, digits) == num(hi, digits):
        return num(lo, digits) + suffix
    return f"{num(lo, digits)}–{num(hi, digits)}{suffix}"


def parse(path):
    head, peaks, runs, end = [], [], [], ""
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("# end"):
            end = line[2:]
        elif line.startswith("#"):
            head.append(line[2:])
        elif line.startswith("peak"):
            j = json.loads(line.split(": ", 1)[1])
            peaks.append(j.get("peak_gflops", j.get("gflops")))
        elif line.count(" | ") >= 5:
            preset, variant, rnd, load, wall, rest = line.split(" | ", 5)
            run = {"preset": preset, "variant": variant, "round": rnd.split()[-1], "load": load.split()[1],
                   "wall": wall}
            if rest.startswith("{"):
                run["json"] = json.loads(rest)
                if "peak_gflops" in run["json"]:
                    peaks.append(run["json"]["peak_gflops"])
            else:
                run["text"] = rest
            runs.append(run)
        elif line.startswith(("pytorch 1:", "pytorch 2:")):
            head.append(line)
    return head, peaks, runs, end


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench_readme_summary.py RESULTS")
    head, peaks, runs, end = parse(sys.argv[1])
    text = "\n".join(head)
    v1 = (re.search(r"pytorch 1: \S+ \(([\w.]+)", text) or [None, "1.x"])[1]
    v2 = (re.search(r"pytorch 2: \S+ \(([\w.]+)", text) or [None, "2.x"])[1]
    v1, v2 = (re.match(r"\d+\.\d+", v1) or [v1])[0], (re.match(r"\d+\.\d+", v2) or [v2])[0]
    peak = statistics.median(peaks) if peaks else float("nan")
    for line in head:
        if not line.startswith("pytorch"):
            print(f"{line}")
    print(f"FMA peak: median {num(peak)} GFLOP/s of {len(peaks)} measurements ({span(peaks)}); {end}")
    loads = [float(r["load"]) for r in runs]
    if loads:
        print(f"load average (1 min) before the runs: {span(loads, 1)}")
    for preset in dict.fromkeys(r["preset"] for r in runs):
        mine = [r for r in runs if r["preset"] == preset]
        # Per round, loom's tokens/s and tokens per step (the PyTorch scripts use the same batch).
        loom = {(r["round"], r["variant"].split()[-1]): r["json"] for r in mine
                if r["variant"].startswith("loom") and "json" in r}
        fpt = next((j["flops_per_token"] for j in loom.values()), None)
        print(f"\n{preset}\n")
        print("| training step | tokens/s | ms/step | GFLOP/s | MFU | peak RSS MiB (before the model) | loom's lead |")
        print("|---|---|---|---|---|---|---|")
        variants = sorted(dict.fromkeys(r["variant"] for r in mine), key=lambda v: ORDER.index(v) if v in ORDER else 99)
        for variant in variants:
            rs = [r for r in mine if r["variant"] == variant]
            name = NAMES.get(variant, variant).format(v1=v1, v2=v2)
            done = [r for r in rs if "json" in r]
            precision = variant.split()[-1]
            cells = []
            if done:
                js = [r["json"] for r in done]
                tps = [j["tokens_per_s"] for j in js]
                f = js[0].get("flops_per_token") or fpt
                gf = [t * f / 1e9 for t in tps] if f else []
                rss = span([j["peak_rss_mib"] for j in js]) + f" ({span([j['start_rss_mib'] for j in js])}"
                if "tensor_peak_mib" in js[0]:
                    rss += f"; tensors {span([j['tensor_peak_mib'] for j in js])}"
                rss += ")"
                if variant.startswith("loom"):
                    lead = []
                    if precision == "bf16":
                        lead = [r["json"]["tokens_per_s"] / loom[(r["round"], "f32")]["tokens_per_s"]
                                for r in done if (r["round"], "f32") in loom]
                    lead_text = (span(lead, 2, "× loom f32") if lead else "")
                else:
                    lead = [loom[(r["round"], precision)]["tokens_per_s"] / r["json"]["tokens_per_s"]
                            for r in done if (r["round"], precision) in loom]
                    lead_text = span(lead, 2, "×") if lead else ""
                cells = [span(tps), span([j["ms_per_step"] for j in js]), span(gf) if gf else "",
                         span([g / peak * 100 for g in gf], 0, "%") if gf else "", rss, lead_text]
                if len(done) < len(rs):
                    lead_text += f" ({len(rs) - len(done)} run(s) did not finish)"
                    cells[-1] = lead_text
            else:
                m = DNF.search(rs[0].get("text", ""))
                if m:
                    n, w, s = (int(x) for x in m.groups())
                    cells = [f"did not finish {n} steps ({w} warm-up) in {s} s", "", "", "", "", ""]
                    ref = loom.get((rs[0]["round"], precision))
                    if "compile" not in variant:
                        # Its steps (warm-up ones included) took more than s / n each: a lower bound on
                        # its ms/step and on loom's lead. Not for torch.compile, whose warm-up compiles.
                        cells[1] = f"> {num(s * 1e3 / n)}"
                        if ref:
                            tokens_per_step = ref["tokens_per_s"] * ref["ms_per_step"] / 1e3
                            bound = ref["tokens_per_s"] / (tokens_per_step * n / s)
                            if bound >= 1:
                                cells[5] = f"> {num(bound, 1)}×"
                else:
                    cells = [rs[0].get("text", "")[:120], "", "", "", "", ""]
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
