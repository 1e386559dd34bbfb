#!/usr/bin/env python3
"""Speed and memory of `loom finetune` against transformers + PEFT, side by side on one CPU.

    python3 tools/finetune_task.py /tmp/sorttask
    python3 tools/finetune_bench.py --loom build/loom --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --data /tmp/sorttask/train.jsonl --python /tmp/peftvenv/bin/python --work /tmp/ft_bench

Not in tools/test.sh or CI (it needs PyPI's torch, transformers and peft, and minutes). What it does:
  1. the base as a loom run (loom import: the GGUF dequantized to f32) for loom, and that run exported as a
     Hugging Face directory for transformers (loom export; the chat template copied into its
     tokenizer_config.json, which the export leaves out): the same f32 weights on both sides;
  2. for each method (LoRA r=16 alpha=32 on every linear layer; full fine-tuning), ROUNDS rounds that run
     loom then PEFT one after the other (alternating, so that a change of the machine's load hits both),
     each a fresh process under /usr/bin/time -v (its peak RSS), the same data (the chat JSON Lines,
     rendered by the model's chat template: loom's renderer and transformers' apply_chat_template give
     the same tokens), the same batch size, steps, AdamW and clipping, THREADS threads
     (training.threads; torch.set_num_threads), no dropout, no evaluation;
  3. tokens/s = the trained (assistant) tokens of a step over its wall time, the median over the steps
     after the first (loom: metrics.jsonl's per-step tokens_per_s; PEFT: timed here the same way).
Prints a table (and --json FILE writes every measurement). The load average is printed before and after.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def sh(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def timed(args, env=None):
    """Runs args under /usr/bin/time -v; returns (stdout+stderr, peak RSS in MiB)."""
    r = subprocess.run(["/usr/bin/time", "-v", *args], capture_output=True, text=True, env=env)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{out[-4000:]}")
    rss = [l for l in out.splitlines() if "Maximum resident set size" in l]
    return out, int(rss[-1].split(":")[1]) / 1024.0


# ---- the PEFT side, run in the venv's python (--peft-worker) ------------------------------------------

def peft_worker(a):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.hf)
    model = AutoModelForCausalLM.from_pretrained(a.hf, torch_dtype=torch.float32)
    if a.method == "lora":
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        model = get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    # Rendering: the model's chat template (SmolLM2's adds its default system message, as loom does);
    # trained: what follows the prompt with the assistant header, up to and with <|im_end|>.
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for line in open(a.data):
        if not line.strip():
            continue
        msgs = json.loads(line)["messages"]
        ids = tok.apply_chat_template(msgs, tokenize=True)
        prompt = tok.apply_chat_template(msgs[:-1], tokenize=True, add_generation_prompt=True)
        last = max(i for i, t in enumerate(ids) if t == end)
        labels = [-100] * len(prompt) + ids[len(prompt):last + 1] + [-100] * (len(ids) - last - 1)
        rows.append((ids, labels))
    g = torch.Generator().manual_seed(1)
    order = torch.randperm(len(rows), generator=g).tolist()
    rates = []
    for step in range(a.steps):
        chosen = [rows[order[(step * a.batch + i) % len(rows)]] for i in range(a.batch)]
        T = max(len(ids) for ids, _ in chosen)
        ids = torch.tensor([r[0] + [0] * (T - len(r[0])) for r in chosen])
        labels = torch.tensor([r[1] + [-100] * (T - len(r[1])) for r in chosen])
        mask = torch.tensor([[1] * len(r[0]) + [0] * (T - len(r[0])) for r in chosen])
        trained = int((labels[:, 1:] != -100).sum())  # HF shifts the labels: the targets of positions 0..T-2
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        rates.append(trained / (time.perf_counter() - t0))
    print("RESULT " + json.dumps({"tokens_per_s": statistics.median(rates[1:]), "loss": float(loss)}))


# ---- the driver --------------------------------------------------------------------------------------

def loom_run(a, work, method, rnd):
    out = os.path.join(work, f"loom_{method}_{rnd}")
    shutil.rmtree(out, ignore_errors=True)
    args = [a.loom, "finetune", "--run", os.path.join(work, "base_run"), "--data", a.data, "--val-data", a.data,
            "--out", out, "--max-steps", str(a.steps), "--lr", str(a.lr), "--set", f"training.batch_size={a.batch}",
            "--set", f"training.threads={a.threads}", "--set", "eval.exact_match=0", "--set", "eval.interval=0",
            "--set", "checkpoint.interval=0", "--set", "logging.interval=1", "--set", "logging.progress=none",
            "--lora-dropout", "0", *a.loom_set]
    args += ["--full"] if method == "full" else ["--lora-targets", "all-linear", "--lora-rank", str(a.rank),
                                                 "--lora-alpha", str(2 * a.rank)]
    _, rss = timed(args)
    rates = [json.loads(l)["tokens_per_s"] for l in open(os.path.join(out, "metrics.jsonl"))
             if '"event":"train"' in l.replace(" ", "")]
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens_per_s": statistics.median(rates[1:]), "peak_rss_mib": rss}


def peft_run(a, work, method):
    args = [a.python, os.path.abspath(__file__), "--peft-worker", "--hf", os.path.join(work, "base_hf"), "--data",
            a.data, "--method", method, "--steps", str(a.steps), "--batch", str(a.batch), "--threads",
            str(a.threads), "--lr", str(a.lr), "--rank", str(a.rank)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    out, rss = timed(args, env)
    res = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    return {"tokens_per_s": res["tokens_per_s"], "peak_rss_mib": rss}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loom", default="build/loom")
    p.add_argument("--gguf", help="the base (a GGUF; exported once to HF for both sides)")
    p.add_argument("--data", required=True, help="chat JSON Lines (tools/finetune_task.py's train.jsonl)")
    p.add_argument("--python", default=sys.executable, help="a python with torch, transformers and peft")
    p.add_argument("--work", default="/tmp/ft_bench")
    p.add_argument("--methods", default="lora,full")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--loom-set", action="append", default=[], help="more loom arguments, e.g. --set=training.precision=bf16")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--hf-max-positions", type=int, default=512,
                   help="max_position_embeddings of the HF copy (transformers 4.38's mask is P x P; see above)")
    # worker mode
    p.add_argument("--peft-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hf", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.peft_worker:
        return peft_worker(a)
    a.data = os.path.abspath(a.data)
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(a.work, "base_hf", "config.json")):
        shutil.rmtree(os.path.join(a.work, "base_run"), ignore_errors=True)
        sh(a.loom, "import", "--gguf", a.gguf, "--out", os.path.join(a.work, "base_run"))
        sh(a.loom, "export", "--run", os.path.join(a.work, "base_run"), "--format", "hf", "--out",
           os.path.join(a.work, "base_hf"))
        src = json.load(open(os.path.join(a.work, "base_run", "tokenizer_config.json")))
        dst_path = os.path.join(a.work, "base_hf", "tokenizer_config.json")
        dst = json.load(open(dst_path))
        for key in ("chat_template", "eos_token", "bos_token"):
            if key in src and key not in dst:
                dst[key] = src[key]
        json.dump(dst, open(dst_path, "w"), indent=1)
    # transformers 4.38's Llama builds its causal mask as a [B, 1, P, P] f32 tensor for P =
    # max_position_embeddings (SmolLM2: 8192, i.e. 2 GiB per row of the batch) whatever the sequence length;
    # later versions do not. RoPE without scaling does not depend on P, so a P that covers the data gives
    # the same logits without charging PEFT for that quirk.
    cfg_path = os.path.join(a.work, "base_hf", "config.json")
    cfg = json.load(open(cfg_path))
    if cfg.get("max_position_embeddings", 0) > a.hf_max_positions:
        cfg["max_position_embeddings"] = a.hf_max_positions
        json.dump(cfg, open(cfg_path, "w"), indent=1)
    load = lambda: os.getloadavg()[0]
    print(f"load average before: {load():.2f}; {a.threads} threads, batch {a.batch}, {a.steps} steps", flush=True)
    results = []
    for method in a.methods.split(","):
        for rnd in range(a.rounds):
            for side in ("loom", "peft"):
                r = loom_run(a, a.work, method, rnd) if side == "loom" else peft_run(a, a.work, method)
                r.update(method=method, side=side, round=rnd, load=round(load(), 2))
                results.append(r)
                print(json.dumps(r), flush=True)
    print(f"load average after: {load():.2f}")
    print("| method | loom tokens/s | PEFT tokens/s | loom / PEFT | loom peak RSS | PEFT peak RSS |")
    print("|---|---|---|---|---|---|")
    for method in a.methods.split(","):
        med = lambda side, key: statistics.median(r[key] for r in results if r["method"] == method and r["side"] == side)
        lt, pt = med("loom", "tokens_per_s"), med("peft", "tokens_per_s")
        print(f"| {method} | {lt:.0f} | {pt:.0f} | {lt / pt:.2f}x | {med('loom', 'peak_rss_mib'):.0f} MiB | "
              f"{med('peft', 'peak_rss_mib'):.0f} MiB |")
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
