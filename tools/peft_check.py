#!/usr/bin/env python3
"""loom finetune against transformers + PEFT: the same base, LoRA config, data, initial adapters and
hyper-parameters (docs/finetune.md has the commands and the results).

    python3 -m venv --system-site-packages VENV && VENV/bin/pip install transformers==4.38.2 peft==0.10.0 accelerate==0.27.2
    VENV/bin/python tools/peft_check.py --loom build/loom --base BASE.gguf --work /tmp/peft_check

Not part of tools/test.sh (it needs PyPI's transformers and peft). What it does:
  1. the base as a Hugging Face directory (loom import + loom export);
  2. loom's initial adapters: `loom finetune` for one step at lr 0, whose adapter/ is A as loom draws it
     and B = 0, in PEFT's files;
  3. `loom finetune` for STEPS steps from the same seed (so the same initial adapters), full-batch (every
     training example in every step, so the order of examples cannot matter), no dropout, AdamW with
     clipping and loom's cosine schedule; its per-step losses from metrics.jsonl;
  4. PEFT from those initial adapters (PeftModel.from_pretrained(..., is_trainable=True)) on the same
     tokens and labels (rendered here as loom renders ChatML: tools/peft_check.py render()), the same
     optimizer and schedule; the per-step losses and the adapters after STEPS steps are compared;
  5. PEFT loads loom's trained adapter: its logits against the HF export of `loom merge`'s merged model;
  6. loom loads PEFT's trained adapter (`loom merge`): the merged model's logits against PEFT's
     merge_and_unload().
Prints one JSON object with the largest differences; exits 1 when a check is outside its tolerance.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def sh(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def write_data(path, n):
    letters = "abcdefghij"
    with open(path, "w") as f:
        for i in range(n):
            w = letters[i % 10] + letters[(i * 3 + 1) % 10] + letters[(i * 7 + 2) % 10]
            f.write(json.dumps({"messages": [{"role": "user", "content": "reverse " + w},
                                             {"role": "assistant", "content": w[::-1]}]}) + "\n")


def render(tok, messages):
    """ChatML as loom renders it (train/sft_data.h): control tokens as ids, the text between encoded on its own;
    trained: each assistant reply's content tokens and its <|im_end|>."""
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    ids, trained = [], []
    for m in messages:
        header = tok.encode(m["role"] + "\n", add_special_tokens=False)
        both = tok.encode(m["role"] + "\n" + m["content"], add_special_tokens=False)
        assert both[:len(header)] == header, "a token straddles the header: render() assumes it does not"
        a = m["role"] == "assistant"
        ids += [start] + both + [end]
        trained += [0] + [0] * len(header) + [int(a)] * (len(both) - len(header)) + [int(a)]
        nl = tok.encode("\n", add_special_tokens=False)
        ids += nl
        trained += [0] * len(nl)
    return ids, trained


def batch(tok, lines):
    rows = [render(tok, json.loads(l)["messages"]) for l in lines]
    T = max(len(ids) for ids, _ in rows)
    input_ids, labels, mask = [], [], []
    for ids, tr in rows:
        pad = T - len(ids)
        input_ids.append(ids + [0] * pad)
        labels.append([i if t else -100 for i, t in zip(ids, tr)] + [-100] * pad)
        mask.append([1] * len(ids) + [0] * pad)
    return torch.tensor(input_ids), torch.tensor(labels), torch.tensor(mask)


def cosine_lr(step, lr, min_lr, warmup, total):
    if step < warmup:
        return step / warmup * lr
    if step <= total:
        if total == warmup:
            return min_lr
        p = (step - warmup) / (total - warmup)
        return min_lr + 0.5 * (1 + math.cos(p * math.pi)) * (lr - min_lr)
    return min_lr


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loom", default="build/loom")
    p.add_argument("--base", required=True, help="a GGUF with a ChatML template (or a loom run)")
    p.add_argument("--work", default="/tmp/peft_check")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--examples", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--targets", default="all-linear")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if os.path.exists(a.work):
        shutil.rmtree(a.work)
    os.makedirs(a.work)
    w = lambda name: os.path.join(a.work, name)
    write_data(w("train.jsonl"), a.examples)
    write_data(w("val.jsonl"), 4)

    sh(a.loom, "import", "--gguf", a.base, "--out", w("base_run")) if a.base.endswith(".gguf") else None
    base_run = w("base_run") if a.base.endswith(".gguf") else a.base
    sh(a.loom, "export", "--run", base_run, "--format", "hf", "--out", w("base_hf"))

    common = ["--run", base_run, "--data", w("train.jsonl"), "--val-data", w("val.jsonl"), "--lora-rank", "4",
              "--lora-alpha", "8", "--lora-dropout", "0", "--lora-targets", a.targets, "--set", "logging.progress=none",
              "--set", "logging.interval=1", "--set", "eval.exact_match=0", "--set", "eval.interval=0",
              "--set", f"training.batch_size={a.examples}", "--set", "checkpoint.interval=0", "--set", "training.seed=7"]
    sh(a.loom, "finetune", *common, "--out", w("init"), "--max-steps", "1", "--lr", "0", "--set", "optimizer.lr=0")
    sh(a.loom, "finetune", *common, "--out", w("loom"), "--max-steps", str(a.steps), "--lr", str(a.lr))
    loom_losses = [json.loads(l)["loss"] for l in open(w("loom/metrics.jsonl")) if '"loss"' in l]

    tok = AutoTokenizer.from_pretrained(w("base_hf"))
    base = AutoModelForCausalLM.from_pretrained(w("base_hf"), torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, w("init/adapter"), is_trainable=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ids, labels, mask = batch(tok, open(w("train.jsonl")).read().splitlines())
    peft_losses = []
    model.train()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, a.lr, 0.0, 0, a.steps)
        opt.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        peft_losses.append(loss.item())
    model.save_pretrained(w("peft_trained"))

    out = {"loom_losses": loom_losses, "peft_losses": peft_losses,
           "max_loss_diff": max(abs(x - y) for x, y in zip(loom_losses, peft_losses))}
    loom_ad = load_file(w("loom/adapter/adapter_model.safetensors"))
    peft_ad = load_file(w("peft_trained/adapter_model.safetensors"))
    assert set(loom_ad) == set(peft_ad), (sorted(loom_ad)[:3], sorted(peft_ad)[:3])
    out["max_adapter_diff"] = max((loom_ad[k] - peft_ad[k]).abs().max().item() for k in loom_ad)

    # 5: PEFT loads loom's trained adapter; loom merges it and exports HF.
    probe = ids[:2, :]
    base2 = AutoModelForCausalLM.from_pretrained(w("base_hf"), torch_dtype=torch.float32)
    with torch.no_grad():
        peft_logits = PeftModel.from_pretrained(base2, w("loom/adapter")).eval()(input_ids=probe).logits
    sh(a.loom, "merge", "--weights", base_run, "--adapter", w("loom/adapter"), "--out", w("loom_merged"))
    sh(a.loom, "export", "--run", w("loom_merged"), "--format", "hf", "--out", w("loom_merged_hf"))
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(w("loom_merged_hf"), torch_dtype=torch.float32).eval()
        out["peft_loads_loom_logits_diff"] = (merged(input_ids=probe).logits - peft_logits).abs().max().item()
    # 6: loom loads PEFT's trained adapter.
    sh(a.loom, "merge", "--weights", base_run, "--adapter", w("peft_trained"), "--out", w("peft_merged"))
    sh(a.loom, "export", "--run", w("peft_merged"), "--format", "hf", "--out", w("peft_merged_hf"))
    with torch.no_grad():
        want = model.eval().merge_and_unload()(input_ids=probe).logits
        got = AutoModelForCausalLM.from_pretrained(w("peft_merged_hf"), torch_dtype=torch.float32).eval()(input_ids=probe).logits
        out["loom_loads_peft_logits_diff"] = (got - want).abs().max().item()
    print(json.dumps(out, indent=1))
    ok = out["max_loss_diff"] < 1e-4 and out["max_adapter_diff"] < 1e-4 and \
        out["peft_loads_loom_logits_diff"] < 1e-4 and out["loom_loads_peft_logits_diff"] < 1e-4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
