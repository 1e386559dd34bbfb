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
    with pytest.raises(ValueError, match=f"max_new_tokens={n}: must be in \\[0, 1000000\\]"):
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


# Issue 32: a model leaked after Ctrl-C in generate. The KeyboardInterrupt's traceback keeps the frames it
# passed through, and a REPL keeps the last one (sys.last_value / sys.last_traceback), so Model.generate's
# frame kept `self` and `del model` freed nothing: every interrupted model stayed (~70 MB each here).
# Run at a module's top level, as a REPL runs it, in a child so the RSS is the loop's alone.
_INTERRUPTED_LOOP = r"""
import gc, os, signal, sys, threading
import loom
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
signal.signal(signal.SIGINT, signal.default_int_handler)
kept, sizes = [], []
for rep in range(6):
    m = loom.TransformerLM(vocab_size=512, context_length=2048, d_model=512, num_layers=4, num_heads=4, d_ff=2048)
    if rep == 0:
        model_mb = m.num_params * 4 / 2**20
    timer = threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        WHAT
    except KeyboardInterrupt:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        kept.append(sys.last_value)  # a REPL keeps only the last; keeping all shows any leak at once
    else:
        raise SystemExit("generate was not interrupted")
    timer.cancel()
    del m
    gc.collect()
    sizes.append(rss_mb())
print(model_mb, " ".join(f"{s:.1f}" for s in sizes))
"""


@pytest.mark.parametrize("what", ["m.generate([1, 2, 3], max_new_tokens=1_000_000)",
                                  "loom.Run(m, _tok, None).generate('ab', max_new_tokens=1_000_000)"])
def test_ctrl_c_in_generate_frees_the_model(what):
    import subprocess
    import sys

    setup = ("_tok = loom.Tokenizer({i: bytes([i]) for i in range(256)} | {256: b'<|endoftext|>'}, [], "
             "['<|endoftext|>'])\n") if "Run" in what else ""
    code = _INTERRUPTED_LOOP.replace("kept, sizes", setup + "kept, sizes", 1).replace("WHAT", what)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    model_mb, *sizes = (float(v) for v in out.stdout.split())
    # After the first model the RSS stays put: five more interrupted models, each kept alive, would add
    # 5 * model_mb.
    growth = max(sizes[1:]) - sizes[1]
    assert growth < model_mb, f"RSS grew {growth:.0f} MB over 5 interrupted models of {model_mb:.0f} MB: {sizes}"
