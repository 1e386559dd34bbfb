#!/usr/bin/env python3
"""Checks that llama.cpp (PyPI's `xllamacpp`, a prebuilt llama.cpp) loads a GGUF that loom wrote and
computes loom's numbers: the prompt's token ids, greedy tokens, and the log-probabilities of the top
candidates at each generated position against loom's log-softmax of the same sequence. Not part of CI.

    python3 -m venv /tmp/xlvenv && /tmp/xlvenv/bin/pip install xllamacpp numpy
    build/loom import --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smol/run
    build/loom export --run /tmp/smol/run --format gguf --gguf-type f32 --out /tmp/smol/loom_f32.gguf
    PYTHONPATH=build/python /tmp/xlvenv/bin/python tools/llamacpp_check.py /tmp/smol/loom_f32.gguf

Any architecture loom exports works the same way, e.g. a GPT-2 run:
    build/loom train --config gpt2-austen --set training.max_steps=200 --out /tmp/g2run200
    build/loom export --run /tmp/g2run200 --format gguf --gguf-type f32 --out /tmp/g2run200.f32.gguf
    PYTHONPATH=build/python /tmp/xlvenv/bin/python tools/llamacpp_check.py /tmp/g2run200.f32.gguf
"""
import json
import sys

import numpy as np
import xllamacpp as x

import loom
from loom import _loom
from loom.model import Model

PROMPTS = [
    "The capital of France is",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "def fib(n):\n    if n < 2:\n        return n\n",
]
N = 16


def main():
    path = sys.argv[1]
    p = x.CommonParams()
    p.model.path = path
    p.n_ctx = 512
    p.cpuparams.n_threads = 2
    p.cpuparams_batch.n_threads = 2
    # An f32 KV cache (llama.cpp's default is f16, which rounds keys and values to 11 bits).
    p.cache_type_k = x.ggml_type.GGML_TYPE_F32
    p.cache_type_v = x.ggml_type.GGML_TYPE_F32
    # Plain attention: llama.cpp's CPU flash-attention kernel multiplies in f16.
    p.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    server = x.Server(p)
    native, native_tok, _ = _loom.load_run(path, True)
    model = Model._wrap_native(native)
    tok = loom.Tokenizer._wrap(native_tok)
    worst_lp, all_same = 0.0, True
    for prompt in PROMPTS:
        r = server.handle_completions({"prompt": prompt, "n_predict": N, "temperature": 0, "top_k": 1, "n_probs": 5,
                                       "cache_prompt": False, "return_tokens": True})
        steps = r["choices"][0]["logprobs"]["content"] if "choices" in r else r["completion_probabilities"]
        cpp_ids = [s["id"] for s in steps]
        ids = list(tok.encode(prompt))
        loom_ids, lp_diff = [], 0.0
        seq = list(ids)
        for s in steps:
            lg = model.forward(np.array(seq, dtype=np.int32))[-1].astype(np.float64)
            logp = lg - (np.log(np.exp(lg - lg.max()).sum()) + lg.max())
            for c in s["top_logprobs"]:
                lp_diff = max(lp_diff, abs(logp[c["id"]] - c["logprob"]))
            loom_ids.append(int(lg.argmax()))
            seq.append(s["id"])  # follow llama.cpp's path, so the comparison continues past a near-tie
        same = loom_ids == cpp_ids
        all_same &= same
        worst_lp = max(worst_lp, lp_diff)
        print(f"{prompt[:40]!r}: {len(ids)} prompt tokens; greedy {N} tokens identical: {same}; "
              f"max |logprob difference| over the top 5 at each step: {lp_diff:.2e}")
        print(f"   llama.cpp: {r['choices'][0]['text'] if 'choices' in r else r['content']!r}")
    print(f"all greedy tokens identical: {all_same}; largest logprob difference: {worst_lp:.2e}")


if __name__ == "__main__":
    main()
