"""Training and generation from Python: a small config end to end, then the run loaded back."""

import json
import math
import os
import subprocess

import numpy as np
import pytest

import loom
from conftest import REPO
from test_tokenizer import EOT, make_text

CLI = os.path.join(REPO, "build", "loom")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    (root / "corpus").mkdir()
    (root / "corpus" / "text.txt").write_text(make_text(20000, seed=7).replace(EOT, "\n"))
    overrides = {
        "data.corpus": str(root / "corpus"), "data.tokenizer": str(root / "bpe" / "tokenizer.json"),
        "data.train": str(root / "bpe" / "train.bin"), "data.val": str(root / "bpe" / "val.bin"),
        "model.vocab_size": 300, "model.context_length": 32, "model.d_model": 32, "model.num_layers": 1,
        "model.num_heads": 2, "model.d_ff": 64, "training.max_steps": 30, "training.batch_size": 8,
        "schedule.warmup_steps": 3, "eval.interval": 10, "eval.batches": 2, "checkpoint.interval": 0,
        "logging.progress": "none", "optimizer.lr": 0.01,
    }
    summary = loom.train("tiny", root / "run", overrides)
    return root / "run", summary, overrides


def test_train_summary_and_files(run_dir):
    path, summary, _ = run_dir
    assert summary["steps_completed"] == 30 and summary["steps_skipped"] == 0
    assert summary["tokens_per_s"] > 0 and not summary["stopped_early"]
    assert summary["last_val_loss"] < summary["first_val_loss"] < math.log(300) + 0.5
    for f in ("model.safetensors", "config.json", "tokenizer.json"):
        assert os.path.exists(path / f), f


def test_load_run_loss_and_generate(run_dir):
    path, summary, _ = run_dir
    run = loom.load_run(path)
    assert run.config["model"]["d_model"] == 32 and run.model.config["vocab_size"] == 300
    text = make_text(200, seed=8).replace(EOT, "\n")
    ids = np.array(run.tokenizer.encode(text))
    t = run.model.config["context_length"]
    expected = run.model.loss(ids[None, :t], ids[None, 1:t + 1])
    assert abs(run.loss(run.tokenizer.decode(ids[:t + 1])) - expected) < 1e-5
    assert run.loss(text) < math.log(300)  # better than uniform after training
    out = run.generate("the quick", max_new_tokens=20, seed=1)
    assert isinstance(out, str) and out == run.generate("the quick", max_new_tokens=20, seed=1)
    assert out != run.generate("the quick", max_new_tokens=20, seed=2)
    # A weights file on its own also loads (the tokenizer beside it comes along).
    alone = loom.load_run(path / "model.safetensors")
    np.testing.assert_array_equal(alone.model.forward(ids[:8]), run.model.forward(ids[:8]))


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="optimizer.lr"):
        loom.resolve_config("tiny", {"optimizer.lr": "abc"})
    with pytest.raises(ValueError, match="bogus"):
        loom.resolve_config("tiny", ["training.bogus=1"])
    with pytest.raises(ValueError, match="tiny"):
        loom.resolve_config("no-such-preset")
    cfg = loom.resolve_config({"model": {"d_model": 64, "num_heads": 4}}, {"training.max_steps": 5})
    assert cfg["model"]["d_model"] == 64 and cfg["training"]["max_steps"] == 5


@pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is built by tools/test.sh")
def test_cli_trains_the_same_weights(run_dir, tmp_path):
    """`loom train` with the same config writes bit-identical weights: loom.train is the same loop."""
    path, _, overrides = run_dir
    cmd = [CLI, "train", "--config", "tiny", "--out", str(tmp_path / "cli")]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd + ["--set", "sample.num_samples=0"], check=True, capture_output=True)
    mine, _ = loom.load_safetensors(path / "model.safetensors")
    theirs, _ = loom.load_safetensors(tmp_path / "cli" / "model.safetensors")
    assert mine.keys() == theirs.keys()
    for k in mine:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)


def test_train_refuses_a_finished_run_and_a_foreign_directory(run_dir, tmp_path):
    """loom.train follows `loom train`'s run-directory rules: a finished run is not replaced unless
    overwrite=True, and a directory loom did not write is never written into."""
    path, _, overrides = run_dir
    with pytest.raises(ValueError, match="overwrite"):
        loom.train("tiny", path, overrides)
    assert json.loads((path / "run.json").read_text())["state"] == "finished"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError):
        loom.train("tiny", foreign, overrides)
    assert (foreign / "notes.txt").read_text() == "keep me"
