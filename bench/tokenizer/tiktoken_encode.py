#!/usr/bin/env python3
"""tiktoken's side of bench/tokenizer/encode_vs_tiktoken.py: GPT-2 encoding of a file, whole process.

usage: tiktoken_encode.py GPT2_DIR FILE THREADS [--print] [--time]
Ranks come from GPT2_DIR (vocab.json + merges.txt, as tools/fetch_gpt2_vocab.py installs them), so
nothing is downloaded. THREADS == 1 uses Encoding.encode on the whole text; more uses encode_batch over
line-aligned pieces (tiktoken's own multi-threaded path). --print writes the ids like `loom tokenizer
encode` does; without it only their count is printed (which favours tiktoken). --time reports, on
stderr, the CPU and wall seconds of loading the ranks and of the encode call alone.
"""
import sys
import time

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def main():
    gpt2_dir, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c0, w0 = time.process_time(), time.perf_counter()
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=f"{gpt2_dir}/merges.txt",
                                            encoder_json_file=f"{gpt2_dir}/vocab.json")
    enc = tiktoken.Encoding(name="gpt2", pat_str=PAT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    c1, w1 = time.process_time(), time.perf_counter()
    text = open(path, encoding="utf-8").read()
    c2, w2 = time.process_time(), time.perf_counter()
    allowed = {"<|endoftext|>"}
    if threads == 1:
        ids = enc.encode(text, allowed_special=allowed)
    else:
        # Cut at newlines followed by a non-space character: GPT-2's regex always ends a piece there.
        parts, start, step = [], 0, max(1, len(text) // (threads * 8))
        while start < len(text):
            cut = start + step
            while cut < len(text) and not (text[cut - 1] == "\n" and not text[cut].isspace() and text[cut - 2] != "\n"):
                cut += 1
            parts.append(text[start:cut])
            start = cut
        ids = [i for chunk in enc.encode_batch(parts, num_threads=threads, allowed_special=allowed) for i in chunk]
    c3, w3 = time.process_time(), time.perf_counter()
    if "--time" in sys.argv:
        print(f"tiktoken: load ranks {c1 - c0:.3f}s cpu {w1 - w0:.3f}s wall; "
              f"encode {c3 - c2:.3f}s cpu {w3 - w2:.3f}s wall", file=sys.stderr)
    if "--print" in sys.argv:
        sys.stdout.write(" ".join(map(str, ids)) + "\n")
    else:
        print(len(ids))


if __name__ == "__main__":
    main()
