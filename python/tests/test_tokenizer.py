"""The BPE tokenizer and trainer against a pure-Python reference (CS336 semantics, ASCII text, where
GPT-2's \\p{L}/\\p{N} classes reduce to [A-Za-z]/[0-9] and Python's re can run the pattern)."""

import itertools
import json
import os
import re
import threading
import time
from collections import Counter

import numpy as np
import pytest

import loom
from conftest import REPO

PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"
V = 330  # below the 345 tokens where this corpus runs out of pairs


def make_text(n_words=4000, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Elizabeth", "Darcy", "it's",
             "they're", "we'll", "1813", "42", "pride", "prejudice", "a", "an", "of", "and", "truth"]
    punct = [",", ".", "!", "?", ";", " --", "\n", "\n\n", "  ", " " + EOT + " "]
    out = []
    for _ in range(n_words):
        out.append(words[rng.integers(len(words))])
        out.append(punct[rng.integers(len(punct))] if rng.random() < 0.3 else " ")
    return "".join(out)


def split_special(text, specials):
    if not specials:
        return [(text, False)]
    pat = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    return [(p, p in specials) for p in re.split(pat, text) if p]


def ref_train(text, vocab_size, specials):
    counts = Counter()
    for part, special in split_special(text, specials):
        if not special:
            for piece in PAT.findall(part):
                counts[tuple(bytes([b]) for b in piece.encode())] += 1
    vocab = [s.encode() for s in specials] + [bytes([b]) for b in range(256)]
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for word, c in counts.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab.append(best[0] + best[1])
        new = Counter()
        for word, c in counts.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new[tuple(out)] += c
        counts = new
    return dict(enumerate(vocab)), merges


def ref_encode(text, vocab, merges, specials):
    ids = {b: i for i, b in vocab.items()}
    rank = {m: r for r, m in enumerate(merges)}
    out = []
    for part, special in split_special(text, specials):
        if special:
            out.append(ids[part.encode()])
            continue
        for piece in PAT.findall(part):
            word = [bytes([b]) for b in piece.encode()]
            while len(word) > 1:
                pairs = [(rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(word, word[1:]))]
                r, i = min(pairs)
                if r == 1 << 30:
                    break
                word[i:i + 2] = [word[i] + word[i + 1]]
            out.extend(ids[w] for w in word)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    text = make_text()
    path = tmp_path_factory.mktemp("bpe") / "corpus.txt"
    path.write_text(text)
    return text, path


@pytest.fixture(scope="module")
def trained(corpus):
    text, path = corpus
    return loom.train_bpe(path, V, [EOT])


def test_train_bpe_matches_reference(corpus, trained):
    text, _ = corpus
    vocab, merges = trained
    ref_vocab, ref_merges = ref_train(text, V, [EOT])
    assert len(vocab) == V and all(isinstance(v, bytes) for v in vocab.values())
    assert merges == ref_merges
    assert vocab == ref_vocab
    assert vocab[0] == EOT.encode() and vocab[1] == b"\x00"


def test_encode_decode_match_reference(corpus, trained):
    text, _ = corpus
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT])
    sample = text[:3000] + " Unicode: caf\u00e9 \u4e2d\u6587 \U0001F600"
    ids = tok.encode(text[:3000])
    assert ids == ref_encode(text[:3000], vocab, merges, [EOT])
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.encode(text, threads=0) == tok.encode(text)
    assert tok.encode_array(text[:500]).tolist() == tok.encode(text[:500])
    assert tok.vocab == vocab and tok.merges == merges and tok.special_tokens == [EOT]


def test_special_tokens(trained):
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT, EOT + EOT])  # the double token is appended to the vocab
    assert tok.vocab_size == V + 1
    ids = tok.encode("a" + EOT + EOT + "b" + EOT)
    assert ids[1] == V and ids[-1] == 0  # the longest special token wins
    plain = loom.Tokenizer(vocab, merges)
    assert 0 not in plain.encode("x " + EOT)  # without special tokens, the text is ordinary bytes


def test_decode_errors_and_replacement(trained):
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT])
    first = tok.encode("\u00e9")  # two bytes, two tokens here
    assert tok.decode_bytes(first) == "\u00e9".encode()
    assert tok.decode([tok.token_id(b"\xc3")]) == "\ufffd"
    with pytest.raises(ValueError, match=str(V)):
        tok.decode([V])
    with pytest.raises(ValueError):
        loom.Tokenizer({0: b"a", 2: b"b"}, [])
    with pytest.raises(ValueError):
        loom.Tokenizer({i: bytes([i]) for i in range(256)}, [(b"a", b"zz")])


def test_encode_iterable_is_exact_and_lazy(corpus, trained):
    text, path = corpus
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT])
    whole = tok.encode(text)
    with open(path) as f:
        assert list(tok.encode_iterable(f)) == whole
    pieces = [text[i:i + 37] for i in range(0, len(text), 37)]  # cuts inside words and special tokens
    assert list(tok.encode_iterable(pieces, chunk_bytes=64)) == whole

    consumed = 0

    def lines():
        nonlocal consumed
        for line in itertools.cycle(text.splitlines(keepends=True)):
            consumed += 1
            yield line

    first = list(itertools.islice(tok.encode_iterable(lines(), chunk_bytes=256), 50))
    assert first == whole[:50] and consumed < 200  # ids come out long before the (endless) input ends


def test_formats_round_trip(trained, tmp_path):
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT])
    text = make_text(300, seed=2)
    tok.save(tmp_path / "tokenizer.json")
    assert json.load(open(tmp_path / "tokenizer.json"))["model"]["type"] == "BPE"
    assert loom.Tokenizer.from_file(tmp_path / "tokenizer.json").encode(text) == tok.encode(text)
    tok.save_gpt2(tmp_path / "gpt2")
    again = loom.Tokenizer.from_files(tmp_path / "gpt2" / "vocab.json", tmp_path / "gpt2" / "merges.txt", [EOT])
    assert again.encode(text) == tok.encode(text)
    assert loom.Tokenizer.from_file(tmp_path / "gpt2").encode(text) == tok.encode(text)
    with pytest.raises(OSError):
        loom.Tokenizer.from_file(tmp_path / "missing.json")


@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, "data", "gpt2", "vocab.json")),
                    reason="GPT-2's vocabulary is fetched by tools/setup.sh")
def test_gpt2_known_ids():
    d = os.path.join(REPO, "data", "gpt2")
    tok = loom.Tokenizer.from_files(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"), [EOT])
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(EOT) == [50256]


def test_encode_starts_no_thread(trained, tmp_path):
    """encode(threads=1) never raises the process's thread count: a Python thread samples
    /proc/self/status while encode runs with the GIL released. threads=0 on a multi-core machine is the
    control: there the workers show up, so the check can fail."""
    vocab, merges = trained
    tok = loom.Tokenizer(vocab, merges, [EOT])
    text = make_text(100000, 5)

    def threads():
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("Threads:")).split()[1])

    def peak_during(fn):
        stop, peak = threading.Event(), [0]

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], threads())
                time.sleep(0.0002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(0.01)
        base = threads()
        fn()
        stop.set()
        sampler.join()
        return base, peak[0]

    # A thread another test left behind may start or end during a window (seen once in a full run: 5
    # against 4), so each check gets three windows and must be clean in one; a thread encode itself
    # started would show in all three.
    def clean_once(fn):
        seen = [peak_during(fn)]
        while seen[-1][1] != seen[-1][0] and len(seen) < 3:
            seen.append(peak_during(fn))
        return seen[-1][1] == seen[-1][0], seen

    ok, seen = clean_once(lambda: tok.encode(text))
    assert ok, f"encode(threads=1) raised the thread count (base, peak) in every window: {seen}"
    ok, seen = clean_once(lambda: sum(1 for _ in tok.encode_iterable(text.splitlines(keepends=True))))
    assert ok, f"encode_iterable raised the thread count (base, peak) in every window: {seen}"
    if (os.cpu_count() or 1) >= 2:
        base, peak = peak_during(lambda: tok.encode(text, threads=2))
        assert peak > base
