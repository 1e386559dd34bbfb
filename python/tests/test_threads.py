"""Threads: out-of-range thread counts are errors naming the value (100000 once aborted the process)."""

import numpy as np
import pytest

import loom

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "1984", "caf\u00e9", "it's"]
    rng = np.random.default_rng(0)
    text = " ".join(words[i] for i in rng.integers(len(words), size=3000)) + " " + EOT
    path = tmp_path_factory.mktemp("tok") / "corpus.txt"
    path.write_text(text)
    vocab, merges = loom.train_bpe(path, 300, [EOT])
    return loom.Tokenizer(vocab, merges, [EOT])


@pytest.mark.parametrize("threads", [100000, 1025, -1, 2**40])
def test_encode_refuses_thread_counts_out_of_range(tok, threads):
    # 100000 used to abort the process: a std::thread that failed to start left the others joinable.
    with pytest.raises(ValueError, match=f"threads must be in \\[0, 1024\\].*got {threads}"):
        tok.encode("hello world " * 10, threads=threads)


def test_train_bpe_refuses_thread_counts_out_of_range(tmp_path):
    (tmp_path / "c.txt").write_text("hello world " * 100)
    with pytest.raises(ValueError, match="threads must be in \\[0, 1024\\].*got 100000"):
        loom.train_bpe(tmp_path / "c.txt", 260, [], threads=100000)


def test_encode_accepts_every_core_and_a_few_threads(tok):
    text = "the quick brown fox " * 500
    want = tok.encode(text)
    assert tok.encode(text, threads=0) == want
    assert tok.encode(text, threads=3) == want
