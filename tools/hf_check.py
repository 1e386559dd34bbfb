#!/usr/bin/env python3
"""The real thing: Hugging Face transformers loads a directory written by `loom export --format hf`.

Trains a tiny loom run on the Austen corpus (its own BPE tokenizer), exports it, loads the export with
transformers' AutoModelForCausalLM and AutoTokenizer, and compares:
  * token ids: AutoTokenizer(text) vs `loom tokenizer encode` on a few passages (unicode, odd spacing,
    the special token);
  * logits: loom's logits for one window (`loom eval --logits-out`) vs transformers', element by element;
    the cross-entropy of transformers' logits on `loom eval`'s windows vs `loom eval`'s loss,
    window by window, and greedy decoding (argmax of the logits, 20 steps) by transformers' generate vs
    `loom generate --weights HFDIR --temperature 0`.
Prints a report (Markdown) to stdout; docs/checkpoints.md holds one such report.

Needs a Python with torch and transformers, e.g.
  /usr/bin/python3 -m venv --system-site-packages /tmp/hfvenv
  /tmp/hfvenv/bin/pip install 'transformers>=4.34,<4.36'     # pairs with Debian's torch 1.13
  /tmp/hfvenv/bin/python tools/hf_check.py --loom build/loom --corpus data/austen --work /tmp/hf_check
DeepSeek-V3 (--config dsv3-tiny) needs a transformers with DeepseekV3 (4.50+), hence torch 2:
  python3 -m venv /tmp/dsv3venv && /tmp/dsv3venv/bin/pip install torch transformers safetensors
  /tmp/dsv3venv/bin/python tools/hf_check.py --config dsv3-tiny --work /tmp/hf_check_dsv3
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def run(cmd, stdin=None):
    r = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--corpus", default="data/austen")
    ap.add_argument("--work", default="/tmp/loom_hf_check")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--num-kv-heads", type=int, default=0,
                    help="train with grouped-query attention (model.num_kv_heads; 0 = num_heads; llama only)")
    ap.add_argument("--config", default="tiny",
                    help="the loom preset to train: tiny (a Llama, with its own BPE tokenizer) or gpt2-austen "
                         "(GPT-2 with GPT-2's tokenizer, exported as GPT2LMHeadModel) or dsv3-tiny / dsv3-austen (DeepSeek-V3 with "
                         "its own BPE tokenizer, exported as DeepseekV3ForCausalLM; needs transformers >= 4.50 and "
                         "torch 2, e.g. /tmp/dsv3venv)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    tok_dir, run_dir, hf_dir = (os.path.join(a.work, d) for d in ("data", "run", "hf"))
    if not os.path.exists(os.path.join(run_dir, "model.safetensors")):
        gpt2 = a.config.startswith("gpt2")
        family = [] if gpt2 else ["--set", f"data.tokenizer={tok_dir}/tokenizer.json"]
        if not gpt2 and not a.config.startswith("dsv3"):
            family += ["--set", f"model.num_kv_heads={a.num_kv_heads}"]
        run([a.loom, "train", "--config", a.config, "--out", run_dir,
             "--set", f"data.corpus={a.corpus}",
             "--set", f"data.train={tok_dir}/train.bin", "--set", f"data.val={tok_dir}/val.bin",
             "--set", f"training.max_steps={a.steps}", "--set", "sample.num_samples=0",
             "--set", "logging.progress=none", "--set", "logging.peak_flops=1e11"] + family)
    run([a.loom, "export", "--run", run_dir, "--format", "hf", "--out", hf_dir])

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}",
             f"loaded: {type(model).__name__}, {type(tok).__name__}, {sum(p.numel() for p in model.parameters())} parameters, "
             f"{model.config.num_attention_heads} heads, "
             f"{getattr(model.config, 'num_key_value_heads', model.config.num_attention_heads)} key/value heads", ""]

    # Tokenizer: same ids as loom's.
    texts = ["It is a truth universally acknowledged, that a single man in possession of a good fortune",
             "  Mr. Darcy's   letter\n\nwas   read 1813 times!?  ",
             "naïve café — “quoted” 日本語 🙂 <|endoftext|> end"]
    tok_ok = True
    for t in texts:
        hf_ids = tok(t)["input_ids"]
        loom_ids = [int(x) for x in run([a.loom, "tokenizer", "encode", "--tokenizer", os.path.join(run_dir, "tokenizer.json"),
                                          "--special-token", "<|endoftext|>"], stdin=t).split()]
        same = hf_ids == loom_ids
        tok_ok &= same
        lines.append(f"tokenizer ids equal: {same} ({len(hf_ids)} tokens) for {t[:40]!r}")

    # Logits: transformers' loss on loom eval's windows (tokens [kT, kT+T]) vs `loom eval`, window by window.
    T, windows = min(64, model.config.max_position_embeddings), 8
    meta = json.load(open(os.path.join(tok_dir, "meta.json")))
    width = 2 if meta["dtype"] == "uint16" else 4
    raw = open(os.path.join(tok_dir, "val.bin"), "rb").read()
    ids = list(struct.unpack(f"<{len(raw) // width}{'H' if width == 2 else 'I'}", raw))
    lines.append("")
    worst = 0.0
    for k in range(1, windows + 1):
        x = torch.tensor([ids[j * T:j * T + T] for j in range(k)])
        y = torch.tensor([ids[j * T + 1:j * T + T + 1] for j in range(k)])
        with torch.no_grad():
            logits = model(x).logits
        hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
        loom = json.loads(run([a.loom, "eval", "--run", run_dir, "--data", os.path.join(tok_dir, "val.bin"),
                               "--context-length", str(T), "--max-windows", str(k)]))
        worst = max(worst, abs(hf_loss - loom["loss"]))
        if k in (1, windows):
            lines.append(f"loss over the first {k} window(s) of {T} tokens: transformers {hf_loss:.7f}, "
                         f"loom eval {loom['loss']:.7f}")
    lines.append(f"largest loss difference over windows 1..{windows}: {worst:.2e}")

    # Logits element by element: loom's for the first window (`loom eval --logits-out`) vs transformers'.
    from safetensors.torch import load_file
    dump = os.path.join(a.work, "loom_logits.safetensors")
    run([a.loom, "eval", "--weights", hf_dir, "--data", os.path.join(tok_dir, "val.bin"), "--context-length", str(T),
         "--max-windows", "1", "--logits-out", dump])
    loom_out = load_file(dump)
    with torch.no_grad():
        hf_logits = model(loom_out["ids"].long()[None]).logits[0]
    diff = (hf_logits - loom_out["logits"]).abs().max().item()
    same_argmax = bool((hf_logits.argmax(-1) == loom_out["logits"].argmax(-1)).all())
    lines.append(f"logits [{T} x {hf_logits.shape[-1]}] of the first window: max |transformers - loom| = {diff:.2e} "
                 f"(logit scale {hf_logits.abs().max().item():.1f}), argmax equal at every position: {same_argmax}")

    # Greedy decoding follows the argmax of the logits at every step.
    # Prompt and continuation within the model's context (dsv3-tiny's is 32 tokens): past it, loom and
    # transformers extend differently, so the comparison would mean nothing.
    prompt = texts[0]
    p_ids = tok(prompt)["input_ids"]
    if len(p_ids) + 20 > model.config.max_position_embeddings:
        prompt = "It is a truth"
        p_ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        greedy = model.generate(torch.tensor([p_ids]), max_new_tokens=20, do_sample=False, attention_mask=torch.ones(1, len(p_ids), dtype=torch.long),
                                pad_token_id=tok.eos_token_id)[0][len(p_ids):].tolist()
    loom_text = run([a.loom, "generate", "--weights", hf_dir, "--prompt", prompt, "--max-new-tokens", "20",
                     "--temperature", "0"])
    hf_text = prompt + tok.decode(greedy)
    loom_text = loom_text[:-1] if loom_text.endswith("\n") else loom_text  # the CLI ends with a newline
    greedy_same = loom_text == hf_text
    lines.append(f"greedy 20-token continuation identical (loom generate --weights HFDIR vs transformers generate): "
                 f"{greedy_same}")
    lines.append(f"  loom: {loom_text!r}")
    lines.append(f"  hf:   {hf_text!r}")
    print("\n".join(lines))
    ok = tok_ok and worst < 1e-4 and greedy_same and diff < 1e-3 and same_argmax
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
