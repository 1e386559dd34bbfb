#!/usr/bin/env python3
"""Every `loom` command tried the wrong way (issue 32): no run destroyed, no silent garbage, every message true.

The cases are generated from the CLI's own description of its options (`loom options --json`, cli/options.cpp),
not from a hand list: every command and nested command, each option given no value, an empty one, one of the
wrong type, negative, zero, huge, NaN and infinite numbers, an overlong value, bytes that are not UTF-8, a
missing path, a directory where a file is read and a file where a directory is, another command's output,
every output pointed at the run's own directory, inside it, at the command's own input, at a user's file, at
another command's output and at a read-only place (with --overwrite too where the command has it), every
pair of excluding options together, every required option left out, an unknown option and command, for
`train` every config key (`--set`) given a wrong value, and for `train` (each model family) and `finetune`
every declared relation between config keys (`loom options --json` "config_relations": num_heads divides
d_model, min_lr at most lr, ...) broken alone, by values each valid alone: refused, naming both keys and values.

Each case runs build/loom in a scratch directory that holds a real small run (tokenizer, token files, a
2-step `train --config tiny`, its plots, its GGUF and Hugging Face exports), a user's files and a
read-only directory, under a timeout and an address-space limit. The verdicts:

  refused   exit 1 or 2, and stderr's last line starts with "error: " and names the option (or the config
            key) and the value (its start, for a long one), in at most 2,000 characters;
  accepted  exit 0, for a value that can be right (zero, huge, an empty text, an output somewhere new);
  FAIL      a signal (crash), the timeout (hang), more than --max-rss-mib of memory, exit 0 for a value that
            is never right (NaN, a negative count, a missing file, two options that exclude each other), a
            message that does not name what was wrong, or any change to the run, the token files, the
            exports, the user's files or the read-only directory (their trees are compared, names, modes
            and contents, after every case).

Run as root, the cases run as `nobody` (owning the scratch copy) so that the read-only directory is read-only.
Exit status: 0 when no case fails, 1 otherwise. tools/test.sh runs it through CTest (WrongWay.Cli).
"""
import argparse
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import pwd
import queue
import random
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Where each kind of input (an option's "holds") finds a real artifact in the scratch directory, and for
# "another command's output" one of another kind.
ARTIFACTS = {
    "run": "runs/t",
    "weights": "runs/t/model.safetensors",
    "safetensors": "runs/t/model.safetensors",
    "tokens": "data/austen_bpe512/val.bin",
    "tokenizer": "data/austen_bpe512/tokenizer.json",
    "text": "text/corpus.txt",
    "ids": "text/ids.txt",
    "gguf": "exports/t.gguf",
    "hf": "exports/hf",
    "config": "configs/tiny.json",
    "rdata": "rdata",
    "chat-jsonl": "text/chat.jsonl",
    "peft-adapter": "runs/ft/adapter",
}
# Another command's output for an input that holds `kind`: a file or directory a user could plausibly give
# by mistake (a file where a file is read, a directory where a directory is).
WRONG_ARTIFACT = {
    "run": "data/austen_bpe512",
    "weights": "data/austen_bpe512/val.bin",
    "safetensors": "exports/t.gguf",
    "tokens": "data/austen_bpe512/tokenizer.json",
    "tokenizer": "runs/t/model.safetensors",
    "text": "runs/t/model.safetensors",
    "ids": "text/corpus.txt",
    "gguf": "runs/t/model.safetensors",
    "hf": "data/austen_bpe512",
    "config": "data/austen_bpe512/tokenizer.json",
    "rdata": "runs/t",
    "chat-jsonl": "text/corpus.txt",
    "peft-adapter": "runs/t",
}

# Weights that hold NaN (runs/nan, a copy of runs/t poisoned in make_scratch), for an input holding this,
# and the commands whose output is computed from the weights (the rest may read them: export, plot).
NAN_INPUT = {"run": "runs/nan", "weights": "runs/nan/model.safetensors"}
COMPUTES = {"generate", "chat", "eval", "train", "finetune", "merge"}

# The outputs in the scratch directory that a writer's --overwrite may replace: its own kind.
OWN_KIND = {("train", "run-dir"): True, ("export", "hf-export"): True, ("export", "gguf-export"): True}

# One valid command line per command (with {new}: a fresh output place per case), into which the cases put
# one wrong value. This is the fixture; the cases themselves come from the option descriptions.
BASE = {
    "bench peak": ["--threads", "1"],
    "bench bandwidth": ["--mib", "8", "--threads", "1"],
    "bench qmatmul": ["-n", "64", "-k", "64", "--calls", "2", "--threads", "1"],
    "bench decode": ["--layers", "1", "--vocab", "256", "--new-tokens", "2", "--prompt-tokens", "2", "--repeats", "1",
                     "--threads", "1"],
    "bench train": ["--preset", "tiny", "--steps", "1", "--warmup", "0", "--batch", "1", "--threads", "1"],
    "bench roofline": ["--preset", "tiny", "--steps", "1", "--warmup", "0", "--batch", "1", "--threads", "1",
                       "--bandwidth-mib", "8", "--out", "{new}/roof"],
    "chat": ["--run", "runs/t", "--stdin", "--system", "Hi", "--max-new-tokens", "4", "--temperature", "0"],
    "config": ["--config", "tiny"],
    "corpus austen": ["--rdata", "rdata", "--out", "{new}/corpus"],
    "eval": ["--run", "runs/t", "--data", "data/austen_bpe512/val.bin", "--max-windows", "2"],
    "export": ["--run", "runs/t", "--out", "{new}/export"],
    "finetune": ["--run", "runs/t", "--data", "text/chat.jsonl", "--max-steps", "1", "--out", "{new}/ft"],
    "flops": ["--config", "tiny"],
    "generate": ["--run", "runs/t", "--prompt", "It is", "--max-new-tokens", "4"],
    "import": ["--gguf", "exports/t.gguf", "--out", "{new}/import"],
    "inspect": ["runs/t/model.safetensors"],
    "merge": ["--weights", "runs/t", "--adapter", "runs/ft/adapter", "--out", "{new}/merged"],
    "options": ["--json"],
    "plan": ["--config", "tiny", "--devices", "2", "--device", "h100", "--rows", "2"],
    "plot": ["runs/t", "--out", "{new}/plots"],
    "prepare": ["--tokenizer", "data/austen_bpe512/tokenizer.json", "--input", "text/corpus.txt", "--out", "{new}/prep"],
    # --check: load, size the cache, bind, and exit, so a case the server accepts ends (port 0: any free one).
    "serve": ["--run", "runs/t", "--port", "0", "--kv-memory", "8M", "--check"],
    "tokenizer train": ["--input", "text/small.txt", "--vocab-size", "300", "--out", "{new}/tok.json"],
    "tokenizer encode": ["--tokenizer", "data/austen_bpe512/tokenizer.json", "--input", "text/small.txt"],
    "tokenizer decode": ["--tokenizer", "data/austen_bpe512/tokenizer.json", "--input", "text/ids.txt"],
    "train": ["--config", "tiny", "--set", "training.max_steps=1", "--set", "sample.num_samples=0", "--out", "{new}/train"],
    "version": [],
}

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
          "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
          "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
NOT_UTF8 = "\udcff\udcfe"  # the bytes ff fe, as os.fsencode writes them
OVERLONG = "x" * 20000


def escaped(value):
    """The value as loom's messages print it (cli/main.cpp printable_message): bytes that are not UTF-8 as \\xNN."""
    out = []
    for ch in value:
        if "\udc80" <= ch <= "\udcff":
            out.append("\\x%02x" % (ord(ch) - 0xDC00))
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append(ch)
    return "".join(out)


class Case:
    def __init__(self, command, option, cls, args, value=None, must_refuse=False, names=(), stdin=None, note=""):
        self.command = command          # "tokenizer train"
        self.option = option            # "--vocab-size", a config key, or "" for the command itself
        self.cls = cls                  # "negative", "missing-value", "out:run-dir", ...
        self.args = args                # arguments after `loom <command>`
        self.value = value              # the wrong value, for the message check (None: only the names)
        self.must_refuse = must_refuse
        self.names = list(names)        # any of these must appear in the message (empty: no name check)
        self.note = note
        self.is_path = cls.startswith(("in:", "out:"))
        self.own_output = ""  # set for `--overwrite` of an output of the writer's own kind
        self.all_of = []      # a broken relation: both keys and both values must appear in the message

    def label(self):
        v = "" if self.value is None else " " + repr(escaped(self.value)[:40])
        return f"loom {self.command} [{self.option or '-'}] {self.cls}{v}"


def option_names(opt):
    """The forms a message may use for an option: --max-new-tokens, max-new-tokens, max_new_tokens."""
    if opt["positional"]:
        return []
    names = []
    for n in opt["names"]:
        bare = n.lstrip("-")
        names += [n]
        if len(bare) > 1:
            names += [bare.replace("-", "_")]
    return names


def with_option(base, opt, value_args, drop=True, options=None):
    """`base` with the option replaced by value_args (its value in base removed, and those of the options
    it excludes: `generate --weights X` drops the base's --run)."""
    args = list(base)
    if drop:
        excluded = [n for o in (options or {}).values() if o["name"] in opt.get("excludes", []) for n in o["names"]
                    if not o["positional"]]
        for name in excluded:
            while name in args:
                i = args.index(name)
                flag = options and any(o["flag"] for o in options.values() if name in o["names"])
                del args[i:i + (1 if flag else 2)]
        for name in opt["names"]:
            if opt["positional"]:
                continue
            while name in args:
                i = args.index(name)
                del args[i:i + (1 if opt["flag"] else 2)]
    if opt["positional"]:
        # the positional's base value is the first argument that is not an option or an option's value
        i = 0
        while i < len(args):
            if args[i].startswith("-"):
                i += 2
                continue
            del args[i]
            break
        return value_args + args
    return args + value_args


def numeric_values(typ, rng=None):
    """The wrong numbers for an option of CLI11 type `typ`; with the range it declared (cli/command.h
    in_range), a zero or huge value outside it must be refused too."""
    def outside(v):
        if not rng:
            return False
        return v < rng["min"] or (v > rng["max"] if rng["max_inclusive"] else v >= rng["max"])
    cases = [("empty", "", True), ("wrong-type", "abc", True), ("negative", "-1", True), ("zero", "0", outside(0))]
    if typ == "FLOAT":
        cases += [("large", "99999999999999999999", outside(1e20)), ("huge", "1e308", outside(1e308)),
                  ("overflow-exp", "1e999", True), ("nan", "nan", True), ("inf", "inf", True), ("minus-inf", "-inf", True)]
    else:
        huge = 9223372036854775807 if typ == "INT" else 18446744073709551615
        cases += [("overflow", "99999999999999999999", True), ("huge", str(huge), outside(huge)),
                  ("fraction", "0.5", True)]
    return cases


def generate_cases(desc, config_keys, have):
    cases = []
    for cmd in desc["commands"]:
        path = " ".join(cmd["command"])
        if cmd["subcommands"]:
            if cmd["requires_subcommand"]:
                cases.append(Case(path, "", "unknown-command", ["frobnicate"], "frobnicate", True, ["frobnicate"]))
            continue
        if path not in BASE:
            print(f"wrong_way: no base command line for `loom {path}`: add one to BASE", file=sys.stderr)
            sys.exit(2)
        if path == "corpus austen" and not have.get("rdata"):
            continue
        base = BASE[path]
        options = {o["name"]: o for o in cmd["options"]}
        overwrite = "--overwrite" in options
        cases.append(Case(path, "", "unknown-option", base + ["--no-such-option"], "--no-such-option", True,
                          ["--no-such-option"]))
        inputs_in_base = []
        for o in cmd["options"]:
            role = (o.get("path") or {}).get("role", "")
            if role.startswith("in-"):
                for n in o["names"]:
                    if n in base and base.index(n) + 1 < len(base):
                        inputs_in_base.append(base[base.index(n) + 1])
                if o["positional"] and base:
                    inputs_in_base.append(base[0])
        for o in cmd["options"]:
            name, names = o["name"], option_names(o)
            if o["required"]:
                cases.append(Case(path, name, "required-left-out", with_option(base, o, []), None, True,
                                  names or [o["name"]]))
            for other in o["excludes"]:
                if name < other:  # each pair once
                    both = with_option(with_option(base, o, valid_args(o, have)), options[other],
                                       valid_args(options[other], have))
                    cases.append(Case(path, name, "conflict", both, None, True, [name, other]))
            if o["flag"]:
                flag = o["names"][0]
                cases.append(Case(path, name, "flag-with-value", with_option(base, o, [flag + "=bogus"]), "bogus", True,
                                  names))
                continue
            if not o["positional"]:
                cases.append(Case(path, name, "missing-value", with_option(base, o, [o["names"][0]]), None, True, names))
            put = (lambda v, o=o: with_option(base, o, [v] if o["positional"] else [o["names"][0], v], options=options))
            role = (o.get("path") or {}).get("role")
            holds = (o.get("path") or {}).get("holds", "")
            if role and role.startswith("in-"):
                wrong_kind = "user" if role == "in-file" else "user/notes.txt"
                cls_values = [("empty", "", True), ("missing", "missing/none", True),
                              ("not-utf8", "missing/" + NOT_UTF8, True), ("overlong", "p" * 5000, True),
                              ("other-output", WRONG_ARTIFACT.get(holds, "user/notes.txt"), holds != "text")]
                if role != "in-path":
                    cls_values.append(("wrong-kind", wrong_kind, True))
                if holds in NAN_INPUT:  # weights holding NaN: refused where the command computes with them
                    cls_values.append(("nan-weights", NAN_INPUT[holds], path in COMPUTES))
                for cls, v, must in cls_values:
                    cases.append(Case(path, name, "in:" + cls, put(v), v, must, names))
            elif role and role.startswith("out-"):
                targets = [("empty", "", True), ("run-dir", "runs/t", False),
                           ("in-run", "runs/t/model.safetensors" if role == "out-file" else "runs/t/checkpoints", False),
                           ("user-file", "user/notes.txt", False), ("user-dir", "user", False),
                           ("read-only", "ro/sub", False), ("read-only-file", "ro/kept.txt", False),
                           ("tokens-dir", "data/austen_bpe512", False), ("tokenizer-file", "data/austen_bpe512/tokenizer.json", False),
                           ("gguf-export", "exports/t.gguf", False), ("hf-export", "exports/hf", False),
                           ("not-utf8", "{new}/" + NOT_UTF8, False), ("overlong", "{new}/" + "o" * 5000, False)]
                if role == "out-path":
                    targets.append(("in-run-file", "runs/t/model.safetensors", False))
                for i, v in enumerate(sorted(set(inputs_in_base))):
                    targets.append((f"own-input-{i}", v, False))
                for cls, v, must in targets:
                    cases.append(Case(path, name, "out:" + cls, put(v), v, must, names))
                    if overwrite and v and not v.startswith("{new}"):
                        c = Case(path, name, "out:" + cls + "+overwrite", put(v) + ["--overwrite"], v, must, names)
                        if OWN_KIND.get((path, cls)):
                            c.own_output = v
                        cases.append(c)
            elif o["type"] in ("INT", "UINT", "FLOAT"):
                for cls, v, must in numeric_values(o["type"], o.get("range")):
                    cases.append(Case(path, name, cls, put(v), v, must, names))
            else:  # TEXT
                for cls, v, must in [("empty", "", False), ("overlong", OVERLONG, False), ("not-utf8", NOT_UTF8, False),
                                     ("dash", "-1", False)]:
                    cases.append(Case(path, name, cls, put(v), v, must, names))
        if path == "train":  # every config key, through --set
            for key, sample in config_keys:
                for cls, v, must in config_values(sample):
                    cases.append(Case(path, key, "set:" + cls, base + ["--set", f"{key}={v}"], v, must,
                                      [key, key.split(".")[-1]]))
            for cls, v in [("set:unknown-key", "training.no_such_key=1"), ("set:no-equals", "training.max_steps"),
                           ("set:empty", "")]:
                cases.append(Case(path, "--set", cls, base + ["--set", v], v, True, ["--set", "set", "key"]))
    return cases


# The config each model family's relations are broken in (`train --config X`): a family without one
# stops the harness, as a command without a BASE line does.
FAMILY_CONFIG = {"llama": "tiny", "gpt2": "gpt2-austen", "deepseek_v3": "dsv3-tiny"}


def relation_holds(rel, vals):
    a, b = vals[rel["a"]], vals[rel["b"]]
    if rel["zero_exempt"] and a == 0:
        return True
    if rel["kind"] == "divides":
        return a <= 0 or b % a == 0  # a divisor that is not positive is its own key's error
    if rel["kind"] == "at_most":
        return a <= b
    if rel["kind"] == "below":
        return a < b
    raise SystemExit(f"wrong_way: unknown relation kind {rel['kind']!r}: teach relation_holds and break_relation it")


def break_relation(rel, rels, vals):
    """A value for rel["a"] that breaks `rel` and keeps every other relation of `rels` (and is positive, as a
    valid value of such a key is alone), or None."""
    a, b = vals[rel["a"]], vals[rel["b"]]
    if rel["kind"] == "divides":
        candidates = range(max(a, 0) + 1, max(a, 0) + 1 + 4 * abs(b) + 8)
    elif rel["kind"] == "at_most":
        candidates = [b + 1] if isinstance(b, int) else [b * 10 if b else 1.0]
    else:
        candidates = [b]
    for v in candidates:
        new = dict(vals, **{rel["a"]: v})
        if v > 0 and not relation_holds(rel, new) and all(relation_holds(r, new) for r in rels if r is not rel):
            return v
    return None


def relation_cases(command, base, rels, vals):
    """One case per declared relation: its first key given a value that breaks it alone."""
    cases = []
    for rel in rels:
        v = break_relation(rel, rels, vals)
        if v is None:
            raise SystemExit(f"wrong_way: no value of {rel['a']} breaks only `{rel['a']} {rel['kind']} {rel['b']}`")
        text = str(v)
        c = Case(command, f"{rel['a']}/{rel['b']}", "relation:" + rel["kind"], base + ["--set", f"{rel['a']}={text}"],
                 text, True, [rel["a"]])
        c.all_of = [rel["a"], rel["b"], str(vals[rel["b"]])]
        cases.append(c)
    return cases


def flatten(prefix, v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(f"{prefix}.{k}" if prefix else k, x, out)
    else:
        out[prefix] = v
    return out


def all_relation_cases(desc, loom, pristine):
    rels = desc["config_relations"]
    cases = []
    train_tail = BASE["train"][2:]  # after --config tiny
    assert BASE["train"][:2] == ["--config", "tiny"]
    for family, family_rels in rels["model"].items():
        if family not in FAMILY_CONFIG:
            print(f"wrong_way: no config for the {family} family: add one to FAMILY_CONFIG", file=sys.stderr)
            sys.exit(2)
        config = json.loads(subprocess.run([loom, "config", "--config", FAMILY_CONFIG[family]], capture_output=True,
                                           check=True, text=True).stdout)
        vals = flatten("", config, {})
        base = ["--config", FAMILY_CONFIG[family]] + train_tail
        cases += relation_cases("train", base, family_rels + (rels["train"] if family == "llama" else []), vals)
    # finetune's values: the config the scratch's 1-step fine-tune wrote
    with open(os.path.join(pristine, "runs/ft/config.json")) as f:
        vals = flatten("", json.load(f), {})
    cases += relation_cases("finetune", BASE["finetune"], rels["finetune"], vals)
    return cases


def config_values(sample):
    if isinstance(sample, bool):
        return [("wrong-type", "maybe", True), ("empty", "", True)]
    if isinstance(sample, (int, float)):
        return [("wrong-type", "abc", True), ("negative", "-1", True), ("zero", "0", False), ("nan", "nan", True),
                ("inf", "inf", True), ("overflow", "1e999", True), ("huge", "18446744073709551615", False)]
    if isinstance(sample, str):
        return [("empty", "", False), ("overlong", OVERLONG, False), ("not-utf8", NOT_UTF8, False)]
    return []


def valid_args(opt, have):
    if opt["flag"]:
        return [opt["names"][0]]
    holds = (opt.get("path") or {}).get("holds", "")
    value = ARTIFACTS.get(holds, "x")
    return [value] if opt["positional"] else [opt["names"][0], value]


# ---------------------------------------------------------------------------------------------------------
# The scratch directory

def synthetic_text(n_bytes, seed):
    rng = random.Random(seed)
    words = ("the of and to a in that it was her his she he for had with not be as at you by on but all so were "
             "which have my me could would him an no one from this is very said been more any must what they will "
             "do miss mrs mr there when such if much time or should little know how their think than can some only "
             "lady sister mother father house letter morning evening friend heart mind manner happy well good great "
             "never always might soon long first last young dear herself himself nothing everything something "
             "pride prejudice sense sensibility emma persuasion abbey park marriage fortune").split()
    out, size = [], 0
    while size < n_bytes:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ";"]) + " "
        if rng.random() < 0.1:
            sentence += "\n\n"
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


def make_scratch(loom, root, log):
    def run(args, **kw):
        r = subprocess.run([loom] + args, cwd=root, capture_output=True, text=True, env=child_env(), **kw)
        if r.returncode != 0:
            raise SystemExit(f"wrong_way: setup `loom {' '.join(args)}` failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return r

    os.makedirs(os.path.join(root, "text"))
    with open(os.path.join(root, "text/corpus.txt"), "w") as f:
        f.write(synthetic_text(300_000, 0))
    with open(os.path.join(root, "text/small.txt"), "w") as f:
        f.write(synthetic_text(5_000, 1))
    with open(os.path.join(root, "text/question.txt"), "w") as f:  # every case's stdin (chat reads it)
        f.write("Who is she?\n")
    os.makedirs(os.path.join(root, "data/austen_bpe512"))
    run(["tokenizer", "train", "--input", "text/corpus.txt", "--vocab-size", "512", "--special-token", "<|endoftext|>",
         "--special-token", "<|im_start|>", "--special-token", "<|im_end|>", "--out", "data/austen_bpe512/tokenizer.json"])
    run(["prepare", "--tokenizer", "data/austen_bpe512/tokenizer.json", "--input", "text/corpus.txt", "--out",
         "data/austen_bpe512"])
    t0 = time.time()
    run(["train", "--config", "tiny", "--set", "training.max_steps=2", "--set", "sample.num_samples=0", "--out", "runs/t"])
    log(f"setup: trained runs/t (2 steps) in {time.time() - t0:.1f} s")
    # A ChatML template (SmolLM2's) for `loom chat`, as an imported run's tokenizer_config.json holds it.
    with open(os.path.join(root, "runs/t/tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}, f)
    run(["plot", "runs/t"])
    # Chat data and a 1-step LoRA fine-tune of runs/t (its adapter is merge's input).
    with open(os.path.join(root, "text/chat.jsonl"), "w") as f:
        for q, a in [("Who is she?", "Elizabeth."), ("Where?", "At Longbourn."), ("When?", "In the autumn."),
                     ("Why?", "For a ball."), ("How?", "By carriage."), ("With whom?", "Her sister.")]:
            # A short system message: the template's default one alone fills the tiny model's 64 positions.
            f.write(json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    run(["finetune", "--run", "runs/t", "--data", "text/chat.jsonl", "--max-steps", "1", "--out", "runs/ft"])
    # A run whose weights went bad (NaN everywhere, as a diverged run's): every command that computes with
    # them must refuse, naming a tensor, not print the same token over and over.
    shutil.copytree(os.path.join(root, "runs/t"), os.path.join(root, "runs/nan"), ignore=shutil.ignore_patterns(".lock"))
    poison_safetensors(os.path.join(root, "runs/nan/model.safetensors"))
    os.makedirs(os.path.join(root, "exports"))
    run(["export", "--run", "runs/t", "--format", "gguf", "--out", "exports/t.gguf"])
    run(["export", "--run", "runs/t", "--format", "hf", "--out", "exports/hf"])
    ids = run(["tokenizer", "encode", "--tokenizer", "data/austen_bpe512/tokenizer.json", "--input", "text/small.txt"])
    with open(os.path.join(root, "text/ids.txt"), "w") as f:
        f.write(ids.stdout)
    os.makedirs(os.path.join(root, "configs"))
    with open(os.path.join(root, "configs/tiny.json"), "w") as f:
        json.dump({"base": "tiny", "training": {"max_steps": 1}}, f)
    os.makedirs(os.path.join(root, "user/sub"))
    with open(os.path.join(root, "user/notes.txt"), "w") as f:
        f.write("a user's notes: loom must never change this file\n")
    with open(os.path.join(root, "user/model.safetensors"), "wb") as f:
        f.write(b"not loom's: a user's file that happens to have a loom name\n")
    os.makedirs(os.path.join(root, "ro"))
    with open(os.path.join(root, "ro/kept.txt"), "w") as f:
        f.write("read-only\n")
    have = {}
    rdata = os.path.join(ROOT, "data", "janeaustenr")
    if os.path.isfile(os.path.join(rdata, "Rdata.rdb")):
        shutil.copytree(rdata, os.path.join(root, "rdata"))
        have["rdata"] = True
    os.makedirs(os.path.join(root, "new"))
    return have


def poison_safetensors(path):
    """Sets every F32 element of a safetensors file to NaN, in place."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__" or t["dtype"] != "F32":
                continue
            begin, end = t["data_offsets"]
            f.seek(8 + n + begin)
            f.write(struct.pack("<f", float("nan")) * ((end - begin) // 4))


def child_env():
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", "LC_ALL": "C.UTF-8"})
    env.pop("LOOM_TEST_CHECKPOINT_PAUSE_MS", None)
    return env


def snapshot(root):
    """(path -> (mode, size, mtime_ns)) of everything under root but new/; contents are hashed on demand."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "new" or rel.startswith("new" + os.sep):
            dirnames[:] = []
            continue
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            snap[os.path.relpath(p, root)] = (st.st_mode, st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                              st.st_mtime_ns if stat.S_ISREG(st.st_mode) else 0)
    return snap


def file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def changes(root, before, hashes):
    after = snapshot(root)
    out = []
    for p in sorted(set(before) | set(after)):
        if p not in after:
            out.append("deleted " + p)
        elif p not in before:
            out.append("created " + p)
        elif before[p][0] != after[p][0]:
            out.append("mode of " + p)
        elif stat.S_ISREG(after[p][0]) and before[p] != after[p]:
            if after[p][1] != before[p][1] or file_hash(os.path.join(root, p)) != hashes[p]:
                out.append("changed " + p)
    return out


class Worker:
    def __init__(self, pristine, index, loom, args):
        self.root = pristine + f".w{index}"
        self.pristine = pristine
        self.loom = loom
        self.args = args
        self.uid = None
        if os.geteuid() == 0:
            self.uid = pwd.getpwnam("nobody").pw_uid
        self.reset()

    def reset(self):
        if os.path.exists(self.root):
            subprocess.run(["chmod", "-R", "u+w", self.root])
            shutil.rmtree(self.root)
        shutil.copytree(self.pristine, self.root, symlinks=True)
        if self.uid is not None:
            subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", self.root], check=True)
        os.chmod(os.path.join(self.root, "ro"), 0o555)
        self.before = snapshot(self.root)
        self.hashes = {p: file_hash(os.path.join(self.root, p)) for p, (mode, _, _) in self.before.items()
                       if stat.S_ISREG(mode)}

    def run(self, case):
        new = os.path.join(self.root, "new", "case")
        args = [a.replace("{new}", "new/case") for a in case.args]
        out_path, err_path = os.path.join(self.root, "new", "stdout"), os.path.join(self.root, "new", "stderr")
        stdin_path = os.path.join(self.root, "text", "question.txt")
        limit = self.args.address_space_gib << 30

        def preexec():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))

        os.makedirs(new, exist_ok=True)  # {new}/x: a new place in an existing directory
        if self.uid is not None:
            os.chown(new, self.uid, self.uid)
        t0 = time.time()
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(stdin_path, "rb") as stdin:
            p = subprocess.Popen([self.loom] + case.command.split() + [os.fsencode(a) for a in args], cwd=self.root,
                                 stdin=stdin, stdout=out, stderr=err, env=child_env(), preexec_fn=preexec,
                                 start_new_session=True, user=self.uid, group=self.uid)
            timed_out = []

            def kill():
                timed_out.append(True)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

            timer = threading.Timer(self.args.timeout, kill)
            timer.start()
            _, status, usage = os.wait4(p.pid, 0)
            timer.cancel()
            p.returncode = 0  # reaped here
        seconds = time.time() - t0
        with open(err_path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 20000))
            stderr = f.read().decode("utf-8", "replace")
        verdict, detail = judge(case, status, bool(timed_out), usage.ru_maxrss // 1024, stderr, self.args)
        changed = changes(self.root, self.before, self.hashes)
        if verdict == "accepted":
            # A command that succeeded may create new files in a directory no command owns (a user's, a new
            # one); nothing it did may delete or change a file, or add one inside a run (a directory with
            # run.json) or the token directory.
            owned = [p[:-len("run.json")] for p in self.before if p.endswith("/run.json")]
            own = case.own_output  # --overwrite of the writer's own kind of output: it may replace that
            dirty = bool(changed)
            if own and all(c.split(" ", 1)[-1].startswith(own.rstrip("/") + "/") for c in changed):
                changed = []
            if all(c.startswith("created ") and not any(c[8:].startswith(o) for o in owned) for c in changed):
                changed = []
            if dirty and not changed:
                self.reset()
        if changed:
            verdict, detail = "FAIL-changed", "; ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            self.reset()
        else:
            subprocess.run(["rm", "-rf", new])
        return verdict, detail, seconds


def last_line(stderr):
    lines = [l for l in stderr.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def shows_number(value, line):
    """The message shows the number `value` in another notation (18446744073709551615 as 1.84467e+19)."""
    try:
        v = float(value)
    except ValueError:
        return False
    if not math.isfinite(v) or v == 0:
        return False
    for m in re.findall(r"[0-9][0-9.]*(?:e[+-]?[0-9]+)?", line):
        try:
            x = float(m)
        except ValueError:
            continue
        if abs(x - v) <= 1e-5 * abs(v):
            return True
    return False


def judge(case, status, timed_out, rss_mib, stderr, args):
    line = last_line(stderr)
    if timed_out:
        return "FAIL-hang", f"still running after {args.timeout} s; last line: {line[:200]}"
    if os.WIFSIGNALED(status):
        return "FAIL-crash", f"killed by signal {os.WTERMSIG(status)}; last line: {line[:200]}"
    if rss_mib > args.max_rss_mib:
        return "FAIL-memory", f"peak RSS {rss_mib} MiB"
    code = os.WEXITSTATUS(status)
    if code == 0:
        if case.must_refuse:
            return "FAIL-accepted", "exit 0 for a value that is never right"
        return "accepted", ""
    if code not in (1, 2):
        return "FAIL-status", f"exit {code}: {line[:200]}"
    problems = []
    if not line.startswith("error: "):
        problems.append("does not start with 'error: '")
    if len(line) > 2000:
        problems.append(f"{len(line)} characters long")
    shown = escaped(case.value.replace("{new}", "new/case"))[:12] if case.value else ""
    # A path names itself: a message that shows the path given says which option was wrong.
    named = any(n in line for n in case.names) or (case.is_path and shown and shown in line)
    if case.names and not named:
        problems.append("names none of " + ", ".join(case.names))
    if shown and shown not in line and not shows_number(case.value, line):
        problems.append(f"does not show the value {shown!r}")
    for want in case.all_of:
        if want not in line and not shows_number(want, line):
            problems.append(f"does not say {want!r}")
    if problems:
        return "FAIL-message", "; ".join(problems) + ": " + line[:300]
    return "refused", ""



def remove_scratch(scratch):
    """Removes the scratch tree, its read-only places included."""
    subprocess.run(["chmod", "-R", "u+w", scratch])
    shutil.rmtree(scratch, ignore_errors=True)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a case may run")
    ap.add_argument("--address-space-gib", type=int, default=8, help="RLIMIT_AS of each case")
    ap.add_argument("--max-rss-mib", type=int, default=2048, help="peak resident memory a case may reach")
    ap.add_argument("--only", default="", help="run only the cases whose label contains this text")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--report", default="", help="write every case and its verdict to this JSON file")
    args = ap.parse_args()
    loom = os.path.abspath(args.loom)

    def log(msg):
        print(msg, flush=True)

    desc = json.loads(subprocess.run([loom, "options", "--json"], capture_output=True, check=True, text=True).stdout)
    config = json.loads(subprocess.run([loom, "config", "--config", "tiny"], capture_output=True, check=True,
                                       text=True).stdout)
    keys = []

    def leaves(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                leaves(f"{prefix}.{k}" if prefix else k, x)
        elif prefix not in ("description", "base"):
            keys.append((prefix, v))

    leaves("", config)
    scratch = tempfile.mkdtemp(prefix="loom-wrong-way-")
    os.chmod(scratch, 0o755)
    pristine = os.path.join(scratch, "s")
    os.makedirs(pristine)
    t0 = time.time()
    have = make_scratch(loom, pristine, log)
    cases = generate_cases(desc, keys, have) + all_relation_cases(desc, loom, pristine)
    cases = [c for c in cases if args.only in c.label()]
    if args.list:
        for c in cases:
            print(c.label(), "(must refuse)" if c.must_refuse else "")
        print(f"{len(cases)} cases")
        return 0
    log(f"wrong_way: {len(cases)} cases over {sum(1 for c in desc['commands'])} commands, "
        f"{args.jobs} at a time (scratch {scratch})")
    workers = queue.Queue()
    for i in range(args.jobs):
        workers.put(Worker(pristine, i, loom, args))
    # the base command lines themselves: each must succeed and change nothing
    base_cases = [Case(p, "", "base", a) for p, a in BASE.items()
                  if any(" ".join(c["command"]) == p for c in desc["commands"]) and (p != "corpus austen" or have.get("rdata"))]

    def run_case(case):
        w = workers.get()
        try:
            return case, w.run(case)
        finally:
            workers.put(w)

    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for case, (verdict, detail, seconds) in pool.map(run_case, base_cases):
            if verdict != "accepted":
                log(f"BASE FAIL {case.label()}: {verdict} {detail}")
                results.append((case, "FAIL-base", detail, seconds))
        for case, (verdict, detail, seconds) in pool.map(run_case, cases):
            results.append((case, verdict, detail, seconds))
            if verdict.startswith("FAIL"):
                log(f"{verdict}: {case.label()}: {detail}")
    counts = collections.Counter(v for _, v, _, _ in results if True)
    fails = [r for r in results if r[1].startswith("FAIL")]
    slowest = sorted(results, key=lambda r: -r[3])[:3]
    log(f"wrong_way: {len(cases)} cases in {time.time() - t0:.0f} s: " +
        ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    log("slowest: " + "; ".join(f"{c.label()[:80]} {s:.1f} s" for c, _, _, s in slowest))
    if args.report:
        with open(args.report, "w") as f:
            json.dump([{"case": c.label(), "command": c.command, "option": c.option, "class": c.cls,
                        "verdict": v, "detail": d, "seconds": round(s, 2)} for c, v, d, s in results], f, indent=1)
    if not args.keep:
        remove_scratch(scratch)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
