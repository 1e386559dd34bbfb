"""generate under misuse: max_new_tokens past its bound is an error, and Ctrl-C stops a long run."""

import os
import signal
import threading
import time

import pytest

import loom


def tiny_model():
    return loom.TransformerLM(vocab_size=64, context_length=32, d_model=16, num_layers=1, num_heads=2, d_ff=32)


@pytest.mark.parametrize("n", [1_000_001, 2**40])
def test_generate_bounds_max_new_tokens(n):
    with pytest.raises(ValueError, match=f"max_new_tokens must be in \\[0, 1000000\\], got {n}"):
        tiny_model().generate([1, 2, 3], max_new_tokens=n)


def test_generate_honours_ctrl_c():
    # A long generate used to hold the process until it finished: SIGINT was only seen afterwards.
    model = tiny_model()
    start = time.monotonic()
    model.generate([1, 2, 3], max_new_tokens=200)  # warm up, and a feel for the speed
    per_token = (time.monotonic() - start) / 200
    # Python's own Ctrl-C handler, even where this runs with SIGINT ignored (a background job of a shell
    # without job control starts so, and Python then installs no handler).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.generate([1, 2, 3], max_new_tokens=1_000_000, temperature=1.0, seed=1)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"generate took {elapsed:.1f}s to stop (a token takes {per_token * 1e3:.3f} ms)"
    # The model still works afterwards.
    assert len(model.generate([1, 2, 3], max_new_tokens=5)) == 5
