"""Threads: out-of-range thread counts are errors naming the value (100000 once aborted the process),
and one tokenizer and one optimizer shared by several Python threads neither crash nor corrupt."""

import threading

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
    with pytest.raises(ValueError, match=f"threads={threads}: must be in \\[0, 1024\\]"):
        tok.encode("hello world " * 10, threads=threads)


def test_train_bpe_refuses_thread_counts_out_of_range(tmp_path):
    (tmp_path / "c.txt").write_text("hello world " * 100)
    with pytest.raises(ValueError, match="threads=100000: must be in \\[0, 1024\\]"):
        loom.train_bpe(tmp_path / "c.txt", 260, [], threads=100000)


def test_encode_accepts_every_core_and_a_few_threads(tok):
    text = "the quick brown fox " * 500
    want = tok.encode(text)
    assert tok.encode(text, threads=0) == want
    assert tok.encode(text, threads=3) == want


def test_adamw_is_safe_and_counts_honestly_under_threads():
    # Steps from several threads used to race on the optimizer's wrapped parameters: some failed, yet
    # every one was counted.
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(200_000).astype(np.float32), rng.standard_normal((300, 300)).astype(np.float32)]
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    ref = [p.copy() for p in params]
    n_threads, steps = 6, 15
    opt = loom.AdamW(lr=1e-3, weight_decay=0.1)
    errors = []

    def worker():
        try:
            for _ in range(steps):
                opt.step(params, grads)
        except Exception as e:  # noqa: BLE001  (any failure is the finding)
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert opt.step_count == n_threads * steps
    # Identical gradients every step: any serial order gives the same result as one thread.
    serial = loom.AdamW(lr=1e-3, weight_decay=0.1)
    for _ in range(n_threads * steps):
        serial.step(ref, grads)
    for p, r in zip(params, ref):
        np.testing.assert_array_equal(p, r)


def test_one_tokenizer_and_one_optimizer_shared_by_threads(tok):
    texts = [f"the quick brown fox {i} jumps over the lazy dog {EOT} caf\u00e9 " * (20 + i) for i in range(8)]
    want = [tok.encode(t) for t in texts]
    params = [np.zeros(50_000, np.float32)]
    grads = [np.full(50_000, 0.5, np.float32)]
    opt = loom.AdamW(lr=1e-2, weight_decay=0.0)
    errors = []

    def encoder(i):
        try:
            for r in range(10):
                ids = tok.encode(texts[i], threads=1 + (r % 3))
                assert ids == want[i]
                assert tok.decode(ids) == texts[i]
                assert list(tok.encode_iterable([texts[i][:37], texts[i][37:]], chunk_bytes=64)) == want[i]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def stepper():
        try:
            for _ in range(20):
                opt.step(params, grads)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=encoder, args=(i,)) for i in range(len(texts))]
    threads += [threading.Thread(target=stepper) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert opt.step_count == 60
    # Constant gradient, no decay: every step moves each weight by lr (Adam's normalized step) to within eps.
    np.testing.assert_allclose(params[0], np.full(50_000, -60 * 1e-2, np.float32), rtol=1e-4)
