#!/usr/bin/env python3
"""The Python module tried the wrong way (issue 32), as tools/wrong_way.py tries the CLI.

The cases are generated from the module's own definitions, not from a hand list: every public name in
`loom.__all__`, every public method of its classes (inherited ones too), and for each parameter what its
annotation declares (python/loom/_arrays.py: Range for numbers, Text for free text, Reads/Writes for paths,
ArrayOf for arrays; the extension's own classes by their nanobind signatures). A public parameter without an
annotation, or a callable without a base call below, is an error of the harness.

Every parameter is given, one at a time in an otherwise valid call (BASE), the values of its kind: None, a
value of the wrong type, negative, zero, huge (2^63-1, 2^64, 10^30, 1e308, 10^400), the top of its declared
Range, NaN, +-inf, a fraction for an integer, empty, 20,000-character, NUL-holding and not-UTF-8 (lone
surrogate) strings; for arrays a 0-d one, a Python number, empty ones (a zero leading and a zero last
dimension), a non-contiguous view, a nested list, NaN values, floats for ids, ids past int32, complex,
object and string dtypes, a 2^44-element broadcast view; for paths None, an int, bytes that are not UTF-8,
empty, missing, a 5,000-byte name, a directory for a file and a file for a directory, every other artifact
of the scratch tree (a run, its weights, a run whose weights are NaN, a GGUF and a Hugging Face export, a
tokenizer, token files, a config, a checkpoint, GPT-2 vocab/merges, a user's text), and for outputs the run's own directory, a file inside it, a new file inside
it, a user's file and directory, the token directory, a read-only directory and file, a new place. Every
`generate` is also called on a model whose weights were set to NaN.

Conflicting values: every relation an annotation declares between parameters (ArrayOf's shape symbols and
its equal / at_most / multiple_of / below, Relation subclasses such as Divides, AtMost, Requires,
SameShapes, Keys) is broken once while every value alone is right: an array one longer on a shared
symbol, an id equal to the vocabulary size, num_heads that does not divide d_model, a tokenizer larger
than the model, a mesh its mode cannot use. The values are searched among small numbers, valid objects of
the same kind (tokenizers, models, meshes, optimizers, configs) and files of the kinds a path reads, and
one is taken only if every other declared relation of the call still holds. Such a call must be refused,
naming the parameter changed and the other side (its name, or for a quantity of self, its value) and
showing the value. A relation for which no such value is found is an error of the harness.

Verdicts:
  refused   a ValueError, TypeError, OSError or RuntimeError (or a subclass) whose message, at most 2,000
            characters, names the parameter and shows the value (its first 12 characters; for an array its
            dtype or shape);
  accepted  a return for a value the declaration allows, with the reason recorded (in the declared Range,
            declared Text, Optional, a path of a kind it Reads, a new place or a file a writer replaces, an
            array numpy would take), and checked: a 0-d array never comes back as shape (1,), an empty
            array gives a finite result, a non-contiguous view or a nested list gives the base call's result;
  A case still running after --stop-after seconds is stopped by SIGALRM raising an exception (as Ctrl-C
  raises KeyboardInterrupt): accepted for a value its declaration allows (long work), FAIL otherwise.
  FAIL      a crash (the child process killed by a signal: cases run in batches in child processes, so the
            case that crashed is the one started and not finished), a hang (--timeout), a peak RSS above
            --max-rss-mib (each child runs under RLIMIT_AS), another exception type (MemoryError, KeyError,
            IndexError, OverflowError, ...), a return for a value that is never right, a message that does
            not name the parameter or show the value, a wrong result, or any change to the scratch tree (the
            run, its exports, the user's files, the read-only directory: names, modes and SHA-256 compared
            after every case) beyond new files outside run directories and the one file a writer was told
            to replace.

Run as root, the children run as `nobody`, so that the read-only directory is read-only. Exit status 0 when
no case fails. CTest runs it as WrongWay.Python (tests/CMakeLists.txt).
"""
import argparse
import collections
import importlib.util
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_spec = importlib.util.spec_from_file_location("wrong_way_cli", os.path.join(HERE, "wrong_way.py"))
ww = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ww)

OVERLONG = "x" * 20000
ALLOWED = (ValueError, TypeError, OSError, RuntimeError)

# Artifacts of the scratch tree (tools/wrong_way.py's make_scratch, plus py/ below) and the kinds of input
# each one is. A path parameter that Reads one of these kinds may accept it; any other must be refused.
ARTIFACTS = {
    "run": ("runs/t", {"run"}),
    "weights": ("runs/t/model.safetensors", {"safetensors", "loom-weights"}),
    "nan-run": ("runs/nan", set()),
    "nan-weights": ("runs/nan/model.safetensors", {"safetensors"}),
    "gguf": ("exports/t.gguf", {"gguf"}),
    "hf": ("exports/hf", {"hf"}),
    "tokenizer": ("data/austen_bpe512/tokenizer.json", {"tokenizer", "text"}),
    "tokens": ("data/austen_bpe512/train.bin", set()),
    "text": ("text/small.txt", {"text"}),
    "config": ("configs/tiny.json", {"config", "text"}),
    "checkpoint": ("py/ckpt.safetensors", {"safetensors", "checkpoint"}),
    "gpt2-dir": ("py/gpt2", {"gpt2-dir"}),
    "gpt2-vocab": ("py/gpt2/vocab.json", {"gpt2-vocab", "text"}),
    "gpt2-merges": ("py/gpt2/merges.txt", {"gpt2-merges", "text"}),
    "user-file": ("user/notes.txt", {"text"}),
}
DIRECTORIES = {"run", "nan-run", "hf", "gpt2-dir"}
# Output places: (path, what a writer of each kind may do there). "may" places are accepted for the writer
# kinds listed; "replaces": the one existing file such an accepted call may change.
OUTPUTS = {
    "run-dir": ("runs/t", ()),
    "in-run": ("runs/t/model.safetensors", ()),
    "new-in-run": ("runs/t/extra.out", ()),
    "nan-run": ("runs/nan", ()),
    "user-file": ("user/notes.txt", ("file",)),
    "user-dir": ("user/sub", ("dir", "run")),
    "user-dir-full": ("user", ("dir",)),
    "token-file": ("data/austen_bpe512/train.bin", ("file",)),
    "gguf-export": ("exports/t.gguf", ("file",)),
    "hf-export": ("exports/hf", ("dir",)),
    "ro-dir": ("ro", ()),
    "ro-new": ("ro/new.out", ()),
    "ro-file": ("ro/kept.txt", ()),
    "new": ("new/case/out", ("file", "dir", "run")),
    "new-deep": ("new/case/a/b/out", ("file", "dir", "run")),
}


# ---------------------------------------------------------------- the module's own definitions


class Param:
    def __init__(self, name, kind, meta=(), optional=False, positional=False, hint=None, rels=()):
        self.name, self.kind, self.meta, self.optional, self.positional = name, kind, tuple(meta), optional, positional
        self.hint, self.rels = hint, list(rels)

    def find(self, cls):
        return next((m for m in self.meta if type(m).__name__ == cls), None)


def kind_of(hint, loom_arrays):
    """(kind, meta, optional) of an annotation."""
    import typing
    import types
    from numpy.typing import ArrayLike

    optional = False
    arms = loom_arrays._arms(hint)
    if type(None) in arms:
        optional = True
        arms = tuple(a for a in arms if a is not type(None))
    first = arms[0]
    meta = ()
    if typing.get_origin(first) is typing.Annotated:
        first, *meta = typing.get_args(first)
    if first is ArrayLike or any(type(m).__name__ == "ArrayOf" for m in meta):
        return "array", meta, optional
    if first == loom_arrays.Path:
        return "path", meta, optional
    for t, k in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (bytes, "bytes")):
        if first is t:
            return k, meta, optional
    origin = typing.get_origin(first) or first
    import collections.abc as abc
    if origin in (abc.Mapping, dict):
        return "mapping", meta, optional
    if origin in (abc.Sequence, abc.Iterable, list, tuple):
        return "sequence", meta, optional
    return "object", meta, optional


NB_PARAM = re.compile(r"(\w+): ([\w.\[\], ]+?)(?: = \\\d+)?(?=, |\)$)")


def nb_params(fn):
    """Parameters of a nanobind function from its first signature: 'def f(self, data: int = \\0, /) -> T'."""
    text = fn.__nb_signature__[0][0]
    inner = text[text.index("(") + 1:text.rindex(") ->")] + ")"
    positional = "/" in inner
    out = []
    for name, typ in NB_PARAM.findall(inner):
        if name == "self":
            continue
        kind = {"int": "int", "float": "float", "str": "str", "bool": "bool"}.get(typ.strip(), "object")
        out.append(Param(name, kind, positional=positional))
    return out


def api(loom):
    """[(qualname, [Param] or an error string)] for every public callable of `loom`, in a fixed order."""
    import inspect
    import typing
    from loom import _arrays

    def params_of(fn):
        if hasattr(fn, "__nb_signature__"):
            return nb_params(fn)
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
        out = []
        for p in sig.parameters.values():
            if p.name in ("self", "cls") or p.name.startswith("_"):
                continue
            if p.name not in hints:
                return f"parameter {p.name} has no annotation: declare what it takes"
            kind, meta, optional = kind_of(hints[p.name], _arrays)
            out.append(Param(p.name, kind, meta, optional, p.kind == p.POSITIONAL_ONLY, hints[p.name],
                             _arrays.relations_of(hints[p.name])))
        return out

    items = []
    for name in sorted(loom.__all__):
        obj = getattr(loom, name)
        if inspect.isclass(obj):
            init = obj.__init__
            if init is not object.__init__:
                items.append((f"{name}.__init__", params_of(inspect.unwrap(init)) if not hasattr(init, "__nb_signature__")
                              else nb_params(init)))
            for meth in sorted(dir(obj)):
                if meth.startswith("_") and meth != "__call__":
                    continue
                raw = inspect.getattr_static(obj, meth)
                if isinstance(raw, property) or type(raw).__name__ in ("nb_property", "property"):
                    continue
                f = getattr(obj, meth)
                if not callable(f) or (meth == "__call__" and "forward" in dir(obj)):
                    continue  # __call__ is forward
                items.append((f"{name}.{meth}", params_of(f)))
        elif callable(obj):
            items.append((name, params_of(obj)))
    return items


# ---------------------------------------------------------------- base calls: one valid call per callable


class Ctx:
    """Valid objects for the base calls (built on first use in each child)."""

    def __init__(self, loom, np):
        self.loom, self.np = loom, np
        self._cache = {}

    def get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def lm(self):
        return self.get("lm", lambda: self.loom.TransformerLM(64, 16, 16, 1, 2, 32, seed=1))

    def gpt2(self):
        return self.get("gpt2", lambda: self.loom.Model.from_config(GPT2, seed=1))

    def nan_lm(self):
        def make():
            m = self.loom.TransformerLM(64, 16, 16, 1, 2, 32, seed=1)
            m.load_state_dict({k: self.np.full_like(v, self.np.nan) for k, v in m.state_dict().items()})
            return m
        return self.get("nan_lm", make)

    def block(self):
        return self.get("block", lambda: self.loom.TransformerBlock(8, 2, 16, 8, seed=1))

    def tok(self):
        return self.get("tok", lambda: self.loom.Tokenizer.from_file("data/austen_bpe512/tokenizer.json"))

    def run(self):
        return self.get("run", lambda: self.loom.load_run("runs/t"))

    def nan_run(self):
        def make():
            r = self.loom.load_run("runs/t")
            r.model.load_state_dict({k: self.np.full_like(v, self.np.nan) for k, v in r.model.state_dict().items()})
            return r
        return self.get("nan_run", make)

    def adamw(self):
        """An AdamW that has taken one step on one parameter of shape (3,)."""
        def make():
            o = self.loom.AdamW()
            o.step([self.np.zeros(3, self.np.float32)], [self.np.ones(3, self.np.float32)])
            return o
        return self.get("adamw", make)

    def mesh(self):
        return self.get("mesh", lambda: self.loom.Mesh(data=2))

    def sharded(self):
        return self.get("sharded", lambda: self.loom.ShardedModel(LLAMA, self.mesh(), "dp"))

    def f(self, *shape, seed=0):
        return self.np.random.default_rng(seed).standard_normal(shape).astype(self.np.float32)


LLAMA = {"arch": "llama", "vocab_size": 64, "context_length": 16, "d_model": 16, "num_layers": 1, "num_heads": 2,
         "d_ff": 32}
GPT2 = {"arch": "gpt2", "vocab_size": 64, "context_length": 16, "d_model": 16, "num_layers": 1, "num_heads": 2}
TRAIN_OVERRIDES = {"training.max_steps": 1, "sample.num_samples": 0}


def base_calls(c):
    """qualname -> () -> (callable, {param: value}) of a valid call. Model's methods take a TransformerLM and,
    for the family-generic ones, GPT-2 too ("Model.*" uses GPT-2)."""
    np, loom = c.np, c.loom
    ids = np.array([[1, 2, 3, 4]], dtype=np.int64)
    B = {}

    def model_methods(prefix, model):
        B[f"{prefix}.forward"] = lambda: (model().forward, {"ids": ids})
        B[f"{prefix}.loss"] = lambda: (model().loss, {"inputs": ids, "targets": ids})
        B[f"{prefix}.loss_and_grads"] = lambda: (model().loss_and_grads, {"inputs": ids, "targets": ids})
        B[f"{prefix}.generate"] = lambda: (model().generate, {"prompt": [1, 2, 3], "max_new_tokens": 4})
        B[f"{prefix}.save"] = lambda: (model().save, {"path": "new/case/out"})
        B[f"{prefix}.parameter_names"] = lambda: (model().parameter_names, {})
        B[f"{prefix}.state_dict"] = lambda: (model().state_dict, {})
        B[f"{prefix}.parameters"] = lambda: (model().parameters, {})
        B[f"{prefix}.load_state_dict"] = lambda: (model().load_state_dict, {"state": model().state_dict()})
        B[f"{prefix}.from_config"] = lambda: (getattr(loom, prefix).from_config, {"config": LLAMA if prefix == "TransformerLM" else GPT2})
        B[f"{prefix}.load"] = lambda: (getattr(loom, prefix).load, {"path": "runs/t/model.safetensors"})

    model_methods("Model", c.gpt2)
    model_methods("TransformerLM", c.lm)
    B["Model.__init__"] = lambda: (loom.Model, {"_wrap": c.gpt2()._m})
    B["TransformerLM.__init__"] = lambda: (loom.TransformerLM, {"vocab_size": 64, "context_length": 16, "d_model": 16,
                                                                "num_layers": 1, "num_heads": 2, "d_ff": 32})
    B["TransformerBlock.__init__"] = lambda: (loom.TransformerBlock, {"d_model": 8, "num_heads": 2, "d_ff": 16,
                                                                      "max_seq_len": 8})
    B["TransformerBlock.forward"] = lambda: (c.block().forward, {"x": c.f(1, 4, 8), "positions": np.arange(4)})
    for m in ("parameter_names", "state_dict", "parameters"):
        B[f"TransformerBlock.{m}"] = (lambda m=m: (getattr(c.block(), m), {}))
    B["TransformerBlock.load_state_dict"] = lambda: (c.block().load_state_dict, {"state": c.block().state_dict()})
    B["AdamW.__init__"] = lambda: (loom.AdamW, {})
    B["AdamW.step"] = lambda: (loom.AdamW().step, {"params": [np.zeros(3, np.float32)], "grads": [np.ones(3, np.float32)]})
    B["AdamW.state_dict"] = lambda: (c.adamw().state_dict, {})
    B["AdamW.load_state_dict"] = lambda: (loom.AdamW().load_state_dict, {"state": c.adamw().state_dict()})
    B["Mesh.__init__"] = lambda: (loom.Mesh, {"data": 2})
    B["Mesh.parse"] = lambda: (loom.Mesh.parse, {"text": "data=2"})
    B["Mesh.coords"] = lambda: (c.mesh().coords, {"device": 1})
    B["Mesh.coord"] = lambda: (c.mesh().coord, {"device": 1, "axes": "data"})
    B["Run.__init__"] = lambda: (loom.Run, {"model": c.run().model, "tokenizer": c.tok(), "config": None})
    B["Run.loss"] = lambda: (c.run().loss, {"text": "It is a truth universally acknowledged."})
    B["Run.generate"] = lambda: (c.run().generate, {"prompt": "It is", "max_new_tokens": 4})
    # Tensor parallel, so that the mesh's relations to the mode and to the heads can each be broken alone.
    B["ShardedModel.__init__"] = lambda: (loom.ShardedModel, {"config": LLAMA, "mesh": loom.Mesh(tensor=2), "mode": "tp"})
    B["ShardedModel.step"] = lambda: (c.sharded().step, {"ids": np.array([[1, 2, 3, 4], [2, 3, 4, 5]]),
                                                         "targets": np.array([[2, 3, 4, 5], [3, 4, 5, 6]])})
    B["ShardedModel.layout"] = lambda: (c.sharded().layout, {})
    B["ShardedModel.state"] = lambda: (c.sharded().state, {})
    B["Tokenizer.__init__"] = lambda: (loom.Tokenizer, {"vocab": {i: bytes([i]) for i in range(256)}, "merges": []})
    B["Tokenizer.from_file"] = lambda: (loom.Tokenizer.from_file, {"path": "data/austen_bpe512/tokenizer.json"})
    B["Tokenizer.from_files"] = lambda: (loom.Tokenizer.from_files, {"vocab_filepath": "py/gpt2/vocab.json",
                                                                     "merges_filepath": "py/gpt2/merges.txt"})
    B["Tokenizer.token_id"] = lambda: (c.tok().token_id, {"token": b"a"})
    B["Tokenizer.special_token_id"] = lambda: (c.tok().special_token_id, {"text": "<|endoftext|>"})
    B["Tokenizer.encode"] = lambda: (c.tok().encode, {"text": "It is a truth."})
    B["Tokenizer.encode_array"] = lambda: (c.tok().encode_array, {"text": "It is a truth."})
    B["Tokenizer.encode_iterable"] = lambda: (c.tok().encode_iterable, {"iterable": ["It is ", "a truth."]})
    B["Tokenizer.decode"] = lambda: (c.tok().decode, {"ids": [1, 2, 3]})
    B["Tokenizer.decode_bytes"] = lambda: (c.tok().decode_bytes, {"ids": [1, 2, 3]})
    B["Tokenizer.save"] = lambda: (c.tok().save, {"path": "new/case/out"})
    B["Tokenizer.save_gpt2"] = lambda: (c.tok().save_gpt2, {"directory": "new/case/out"})
    B["batch_spec"] = lambda: (loom.batch_spec, {"mode": "dp"})
    B["check_device"] = lambda: (loom.check_device, {"device": "cpu"})
    B["clip_grad_norm"] = lambda: (loom.clip_grad_norm, {"grads": [np.ones(3, np.float32)], "max_norm": 1.0})
    B["cosine_lr"] = lambda: (loom.cosine_lr, {"it": 5, "max_lr": 1e-3, "min_lr": 1e-4, "warmup_iters": 2,
                                               "cosine_cycle_iters": 10})
    B["cross_entropy"] = lambda: (loom.cross_entropy, {"logits": c.f(2, 5), "targets": np.array([1, 2])})
    B["cuda_available"] = lambda: (loom.cuda_available, {})
    B["cuda_device_count"] = lambda: (loom.cuda_device_count, {})
    B["embedding"] = lambda: (loom.embedding, {"ids": np.array([[1, 2]]), "weight": c.f(5, 4)})
    B["get_batch"] = lambda: (loom.get_batch, {"dataset": np.arange(100), "batch_size": 2, "context_length": 4,
                                               "seed": 1})
    B["linear"] = lambda: (loom.linear, {"x": c.f(2, 3, 8), "weight": c.f(5, 8, seed=1)})
    B["load_checkpoint"] = lambda: (loom.load_checkpoint, {"src": "py/ckpt.safetensors", "model": c.lm()})
    B["load_run"] = lambda: (loom.load_run, {"path": "runs/t"})
    B["load_safetensors"] = lambda: (loom.load_safetensors, {"path": "runs/t/model.safetensors"})
    B["multihead_self_attention"] = lambda: (loom.multihead_self_attention, {
        "x": c.f(1, 4, 8), "q_proj": c.f(8, 8, seed=1), "k_proj": c.f(8, 8, seed=2), "v_proj": c.f(8, 8, seed=3),
        "o_proj": c.f(8, 8, seed=4), "num_heads": 2, "theta": 10000.0, "positions": np.arange(4)})
    B["resolve_config"] = lambda: (loom.resolve_config, {"config": "tiny"})
    B["rms_norm"] = lambda: (loom.rms_norm, {"x": c.f(2, 8), "weight": np.ones(8, np.float32)})
    B["rope"] = lambda: (loom.rope, {"x": c.f(1, 4, 8), "positions": np.arange(4)})
    B["save_checkpoint"] = lambda: (loom.save_checkpoint, {"model": c.lm(), "optimizer": None, "iteration": 3,
                                                           "out": "new/case/out"})
    B["save_safetensors"] = lambda: (loom.save_safetensors, {"path": "new/case/out", "tensors": {"a": np.ones(3)}})
    B["scaled_dot_product_attention"] = lambda: (loom.scaled_dot_product_attention, {
        "q": c.f(2, 4, 8), "k": c.f(2, 4, 8, seed=1), "v": c.f(2, 4, 8, seed=2), "mask": np.tril(np.ones((4, 4), bool))})
    B["silu"] = lambda: (loom.silu, {"x": c.f(2, 3)})
    B["softmax"] = lambda: (loom.softmax, {"x": c.f(2, 3)})
    B["swiglu"] = lambda: (loom.swiglu, {"x": c.f(2, 8), "w1": c.f(16, 8, seed=1), "w2": c.f(8, 16, seed=2),
                                         "w3": c.f(16, 8, seed=3)})
    B["train"] = lambda: (loom.train, {"config": "tiny", "out_dir": "new/case/out", "overrides": dict(TRAIN_OVERRIDES)})
    B["train_bpe"] = lambda: (loom.train_bpe, {"input_path": "text/small.txt", "vocab_size": 300,
                                               "special_tokens": ["<|endoftext|>"]})
    B["validate_experts_for_mesh"] = lambda: (loom.validate_experts_for_mesh, {"n_routed": 4, "mesh": loom.Mesh(expert=2),
                                                                               "mode": "dp_ep"})
    B["validate_mesh_for_devices"] = lambda: (loom.validate_mesh_for_devices, {"mesh": c.mesh(), "devices": 2})
    B["validate_mesh_for_mode"] = lambda: (loom.validate_mesh_for_mode, {"mesh": c.mesh(), "mode": "dp"})
    B["validate_mode"] = lambda: (loom.validate_mode, {"mode": "dp"})
    return B


# ---------------------------------------------------------------- the wrong values of each kind

# (variant, never right?) per kind; numbers are then judged against the declared Range.
SCALAR_VARIANTS = {
    "int": ["none", "str", "fraction", "nan", "inf", "bool", "negative", "zero", "huge", "past-uint64", "1e30"],
    "float": ["none", "str", "nan", "inf", "-inf", "negative", "zero", "huge", "1e400"],
    "bool": ["none", "str", "int2"],
    "str": ["none", "int", "bytes", "empty", "overlong", "nul", "surrogate"],
    "bytes": ["none", "str", "empty-bytes", "overlong-bytes"],
    "mapping": ["none", "int", "str"],
    "sequence": ["none", "int"],
    "object": ["none", "int", "str"],
}
ARRAY_VARIANTS = ["none", "str", "dict", "0-d", "py-scalar", "empty-lead", "empty-last", "noncontig", "nested-list", "nan",
                  "float-for-int", "past-int32", "complex", "object", "strings", "huge-view"]
PATH_IN_VARIANTS = ["none", "int", "bytes-not-utf8", "empty", "missing", "dir-for-file", "overlong", "surrogate"] + \
    [f"artifact:{a}" for a in ARTIFACTS]
PATH_OUT_VARIANTS = ["none", "int", "bytes-not-utf8", "empty", "overlong-name", "surrogate"] + [f"out:{o}" for o in OUTPUTS]

NUMBERS = {"negative": -1, "zero": 0, "huge": 2**63 - 1, "past-uint64": 2**64, "1e30": 10**30}
FLOATS = {"negative": -1.0, "zero": 0.0, "huge": 1e308}


def variants_of(p):
    r = p.find("Range")
    if p.kind in ("int", "float") and r is not None and r.hi is not None and r.hi < 2**62:
        # The largest value the declaration allows: a size at its bound must be refused by the memory
        # budget or run, never crash or exhaust the machine.
        return SCALAR_VARIANTS[p.kind] + ["range-max"]
    if p.kind == "array":
        kind = p.find("ArrayOf").kind if p.find("ArrayOf") else "float"
        # Floats for ids and ids past int32 are wrong only where the array is of int32 ids.
        return [v for v in ARRAY_VARIANTS if kind == "int" or v not in ("float-for-int", "past-int32")]
    if p.kind == "path":
        return PATH_OUT_VARIANTS if p.find("Writes") else PATH_IN_VARIANTS
    return SCALAR_VARIANTS[p.kind]


def expectation(p, variant, base_value):
    """(may it be accepted?, why) for giving `variant` to parameter p."""
    if variant == "none":
        return (True, "declared Optional") if p.optional else (False, "")
    if variant == "range-max":
        return True, f"the top of the declared range {p.find('Range').text()}"
    if p.kind in ("int", "float") and variant in NUMBERS or variant in FLOATS and p.kind == "float":
        v = (FLOATS if p.kind == "float" else NUMBERS)[variant]
        if v == base_value:
            return True, "the base call's own value"
        r = p.find("Range")
        if r is not None and v in r:
            return True, f"in the declared range {r.text()}"
        return False, ""
    if p.kind == "str" and variant in ("empty", "overlong", "nul"):
        return (True, "declared Text: any text") if p.find("Text") else (False, "")
    if p.kind == "bytes" and variant in ("empty-bytes", "overlong-bytes"):
        return True, "bytes: any bytes are a token's bytes (None when it is no token)"
    if p.kind == "array":
        kind = p.find("ArrayOf").kind if p.find("ArrayOf") else "float"
        if variant in ("0-d", "py-scalar", "empty-lead", "empty-last"):
            return True, "numpy's semantics: an array of any shape the op takes (checked: shape kept, result finite)"
        if variant in ("noncontig", "nested-list"):
            return True, "the same values as the base call (checked: the same result)"
        if variant == "nan" and kind == "float":
            return True, "float values: NaN propagates as in numpy"
        if variant == "past-int32" and kind == "int64":
            return True, "ArrayOf('int64'): any int64 value"
        return False, ""
    if p.kind == "path" and variant.startswith("artifact:"):
        name = variant.split(":", 1)[1]
        kinds = ARTIFACTS[name][1]
        reads = set(p.find("Reads").kinds) if p.find("Reads") else set()
        if "text" in reads and name not in DIRECTORIES:
            # As the CLI's --input of `tokenizer train` (tools/wrong_way.py: "text" inputs): byte-level BPE
            # takes any file's bytes.
            return True, "Reads('text'): byte-level BPE takes any file's bytes"
        if kinds & reads:
            return True, f"a {'/'.join(sorted(kinds & reads))} file, which it Reads"
        return False, ""
    if p.kind == "path" and variant.startswith("out:"):
        w = p.find("Writes").kind
        if w in OUTPUTS[variant.split(":", 1)[1]][1]:
            return True, ("a new place" if variant.startswith("out:new") else
                          f"Writes({w!r}): an existing file is replaced, as numpy.save does" if w == "file" else
                          f"Writes({w!r}) into an empty directory of the user's")
        return False, ""
    return False, ""


def make_value(variant, p, base_value, np):
    if variant == "none":
        return None
    if p.kind == "array":
        base = np.asarray(base_value)
        return {
            "str": lambda: "abc",
            "dict": lambda: {},
            "0-d": lambda: np.array(base.reshape(-1)[0]),
            "py-scalar": lambda: base.reshape(-1)[0].item(),  # a Python number, as numpy takes one
            "empty-lead": lambda: base[:0],
            "empty-last": lambda: base[..., :0],
            "noncontig": lambda: np.repeat(base, 2, axis=-1)[..., ::2] if base.ndim else base,
            "nested-list": lambda: base.tolist(),
            "nan": lambda: np.full(base.shape, np.nan, np.float32),
            "float-for-int": lambda: base.astype(np.float64) + 0.5,
            "past-int32": lambda: base.astype(np.int64) + 2**40,
            "complex": lambda: base.astype(np.complex64),
            "object": lambda: base.astype(object),
            "strings": lambda: base.astype(str),
            "huge-view": lambda: np.broadcast_to(np.zeros((), base.dtype), (2**22, 2**22)),
        }[variant]()
    if p.kind == "path":
        if variant.startswith("artifact:"):
            return ARTIFACTS[variant.split(":", 1)[1]][0]
        if variant.startswith("out:"):
            return OUTPUTS[variant.split(":", 1)[1]][0]
        return {"int": 3, "bytes-not-utf8": b"new/case/\xff\xfe", "empty": "", "missing": "new/case/missing.file",
                "dir-for-file": "user/sub", "overlong": "x" * 5000, "overlong-name": "new/case/" + "x" * 300,
                "surrogate": "new/case/\udcff"}[variant]
    table = {
        "str": "3" if p.kind in ("int", "float", "bool") else "str",
        "fraction": 1.5, "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "bool": True, "int2": 2,
        "1e400": 10**400, "int": 3, "bytes": b"x", "empty": "", "overlong": OVERLONG, "nul": "a\0b",
        "surrogate": "\udcff", "empty-bytes": b"", "overlong-bytes": b"x" * 20000,
    }
    if variant in NUMBERS or variant in FLOATS:
        return (FLOATS if p.kind == "float" else NUMBERS)[variant]
    if variant == "range-max":
        return p.find("Range").hi
    return table[variant]


def generate_cases(items):
    """[(id, qualname, param name, variant)]; the base calls first, then every parameter's variants."""
    cases = []
    for qual, params in items:
        cases.append((qual, "", "base"))
        if isinstance(params, str):
            continue
        for p in params:
            for v in variants_of(p):
                cases.append((qual, p.name, v))
        if qual.endswith(".generate"):
            cases.append((qual, "self", "nan-weights"))
        cases += [(qual, pname, v) for pname, v in conflict_variants(params)]
        floats = [p for p in params if p.kind == "array" and p.find("ArrayOf") and p.find("ArrayOf").kind == "float"]
        if len(floats) >= 2:
            # Every float array emptied along its last axis at once: a product over K = 0 (numpy gives
            # zeros), an empty feature axis; a refusal must come from the function, not from a kernel below.
            cases.append((qual, "*", "all-empty-last"))
    return [(i,) + c for i, c in enumerate(cases)]


# ---------------------------------------------------------------- conflicting values: relations broken
#
# Generated from the relations the annotations declare (python/loom/_arrays.py: ArrayOf's shape symbols and
# equal/at_most/multiple_of/below, and Relation subclasses such as Divides, AtMost, Requires, SameShapes,
# Keys): for each, one call that breaks it while every value alone is right. Such a call must be refused
# with a message that names the parameter and the other side of the relation and shows the value.


def conflict_variants(params):
    """[(param, "conflict:...")] for every relation declared among `params`."""
    out = []
    arrays = [p for p in params if p.kind == "array" and p.find("ArrayOf") is not None
              and p.find("ArrayOf").shape]
    for p in params:
        a = p.find("ArrayOf")
        if a is not None and a.shape:
            for sym in dict.fromkeys(a.shape):
                shared = any(sym in q.find("ArrayOf").shape for q in arrays if q is not p)
                if shared:
                    out.append((p.name, f"conflict:shape:{sym}"))
            for what in ("equal", "at_most", "multiple_of"):
                for sym in getattr(a, what):
                    out.append((p.name, f"conflict:{what}:{sym}"))
        if a is not None and a.below:
            out.append((p.name, "conflict:below"))
        for i, rel in enumerate(p.rels):
            if type(rel).__name__ == "Keys":
                out += [(p.name, f"conflict:keys:{i}:{j}") for j in range(len(rel.pairs))]
            else:
                out.append((p.name, f"conflict:rel:{i}"))
    return out


class NoBreak(Exception):
    """No value found that breaks the relation while each value alone is right: an error of the harness."""


def bind_symbols(params, kwargs, np):
    """Shape symbols -> sizes ("..." -> the leading dimensions) from the base call's arrays."""
    symbols = {}
    for p in params:
        a = p.find("ArrayOf")
        if a is None or not a.shape or kwargs.get(p.name) is None:
            continue
        for sym, (axis, size) in axes_of(a.shape, np.shape(kwargs[p.name])).items():
            symbols.setdefault(sym, size)
    return symbols


def axes_of(shape, actual):
    """{symbol: (axis, size)} for a declared shape ("...", "T", "C") against an actual shape; "..." maps to
    (0, the leading dimensions). The first axis of a repeated symbol ("C, C") is the one taken."""
    out = {}
    lead = len(actual) - (len(shape) - (1 if shape[0] == "..." else 0))
    if lead < 0 or (lead > 0 and shape[0] != "..."):
        raise NoBreak(f"the base value's shape {tuple(actual)} is not the declared {', '.join(shape)}")
    axis = 0
    for sym in shape:
        if sym == "...":
            out.setdefault(sym, (0, tuple(actual[:lead])))
            axis = lead
        else:
            out.setdefault(sym, (axis, actual[axis]))
            axis += 1
    return out


def resized(a, axis, size, np):
    """`a` with `size` entries along `axis`, repeating its own (valid) values."""
    a = np.asarray(a)
    return np.take(a, [i % a.shape[axis] for i in range(size)], axis=axis)


def number_candidates(p, base, target):
    """Numbers to try for p: small ones, around the target and the base value, in p's declared Range."""
    cands = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]
    for t in (target, base):
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            cands += [t - 1, t, t + 1, 2 * t, 3 * t, t * 1.5, t / 2]
    r = p.find("Range") if p is not None else None
    kind = p.kind if p is not None else ("int" if isinstance(base, int) else "float")
    out = []
    for c in cands:
        if kind == "int":
            if c != int(c):
                continue
            c = int(c)
        else:
            c = float(c)
        if (r is None and c < 0) or (r is not None and c not in r) or c in out:
            continue
        out.append(c)
    return out


def object_pool(c, value):
    """Valid objects of the kind of `value` (a base call's value) to try against a relation."""
    loom, np = c.loom, c.np
    if isinstance(value, loom.Tokenizer):
        return [c.get("tok-bytes", lambda: loom.Tokenizer({i: bytes([i]) for i in range(256)}, [])), c.tok()]
    if isinstance(value, loom.TransformerBlock):
        return [c.block(), c.get("block16", lambda: loom.TransformerBlock(16, 2, 16, 8, seed=1))]
    if isinstance(value, loom.Model):
        return [c.lm(), c.gpt2(), c.run().model,
                c.get("lm32", lambda: loom.TransformerLM(64, 16, 32, 1, 2, 32, seed=1))]
    if isinstance(value, loom.Mesh) or type(value).__name__ == "Mesh":
        return [loom.Mesh(data=2), loom.Mesh(tensor=2), loom.Mesh(tensor=4), loom.Mesh(expert=2), loom.Mesh(data=3),
                loom.Mesh(data=2, tensor=2), loom.Mesh(expert=3)]
    if isinstance(value, loom.AdamW):
        def stepped_on_lm():
            o = loom.AdamW()
            ps = list(c.lm().parameters().values())
            o.step(ps, [np.zeros_like(p) for p in ps])
            return o
        return [c.adamw(), c.get("adamw-lm", stepped_on_lm)]
    if isinstance(value, dict) and "model" in value:  # a training config
        return [value, c.get("default-config", lambda: loom.resolve_config("default"))]
    if isinstance(value, list) and all(isinstance(m, tuple) for m in value):  # BPE merges
        return [[], c.tok().merges]
    return []


# Paths read only by the relation cases: GPT-2 files of a tokenizer of the 256 bytes (no merges), whose
# vocabulary another tokenizer's merges.txt does not fit.
RELATION_PATHS = {"py/gpt2-bytes/vocab.json": {"gpt2-vocab"}, "py/gpt2-bytes/merges.txt": {"gpt2-merges"}}


def pool_of(ctx, param, value):
    """Valid values to try for `param`: for a path, every file of a kind it Reads; for an object given
    None in the base call, those of the first class its annotation names."""
    if param is not None and param.kind == "path":
        reads = set(param.find("Reads").kinds) if param.find("Reads") else set()
        return [path for path, kinds in list(ARTIFACTS.values()) + list(RELATION_PATHS.items()) if kinds & reads]
    if value is None and param is not None:
        import typing
        from loom import _arrays
        for arm in _arrays._arms(param.hint):
            cls = typing.get_args(arm)[0] if typing.get_origin(arm) is typing.Annotated else arm
            proto = {"AdamW": ctx.adamw, "Tokenizer": ctx.tok, "Mesh": ctx.mesh,
                     "Mapping": lambda: ctx.run().config}.get(getattr(cls, "__name__", ""))
            if proto is not None:
                return object_pool(ctx, proto())
    return object_pool(ctx, value)


def path_get(value, path):
    """A dotted key path into a config mapping ("optimizer.lr")."""
    for part in path.split("."):
        value = value[part]
    return value


def words_of(path):
    """The words a message may name the other side of a relation by ("model.config.vocab_size": model,
    vocab_size)."""
    return [w for w in re.split(r"[.*]", path) if w and w not in ("self", "config", "len") and not w.isdigit()]


def break_relation(ctx, qual, params, fn, kwargs, pname, variant, np):
    """(kwargs that break the relation `variant` of parameter `pname`, the names one of which the message
    must name for the value changed (its parameter first), the texts one of which it must show, the words
    one of which it must name for the other side)."""
    from loom import _arrays
    kwargs = dict(kwargs)
    p = next(q for q in params if q.name == pname)
    args = dict(kwargs)
    if hasattr(fn, "__self__") and not isinstance(fn.__self__, type):
        args["self"] = fn.__self__
    symbols = bind_symbols(params, kwargs, np)
    _, what, *rest = variant.split(":")
    a = p.find("ArrayOf")

    if what == "shape":
        sym = rest[0]
        if kwargs.get(pname) is None:
            raise NoBreak(f"the base call gives no {pname}")
        base = np.asarray(kwargs[pname])
        axis, size = axes_of(a.shape, base.shape)[sym]
        if sym == "...":
            if not size:
                raise NoBreak(f"the base {pname} has no leading dimensions")
            size = size[0]
        kwargs[pname] = resized(base, axis, size + 1, np)
        others = [q.name for q in params if q is not p and q.find("ArrayOf") is not None and q.find("ArrayOf").shape
                  and sym in q.find("ArrayOf").shape]
        return kwargs, [pname], [str(kwargs[pname].shape), str(list(kwargs[pname].shape))], others

    if what in ("equal", "at_most", "multiple_of"):
        sym = rest[0]
        path = getattr(a, what)[sym]
        bound = _arrays.quantity(path, args, symbols)
        if what == "multiple_of":
            if bound < 2:
                raise NoBreak(f"{path} = {bound}: every size is a multiple")
            size = bound + 1
        else:
            size = bound + 1
        # Every array of the call with that symbol takes the new size, so that only this relation breaks.
        for q in params:
            qa = q.find("ArrayOf")
            if qa is not None and qa.shape and sym in qa.shape and kwargs.get(q.name) is not None:
                axis, _ = axes_of(qa.shape, np.shape(kwargs[q.name]))[sym]
                kwargs[q.name] = resized(kwargs[q.name], axis, size, np)
        return kwargs, [pname], [str(size), str(bound)], words_of(path) + [str(bound)] + (["even"] if bound == 2 else [])

    if what == "below":
        bound = int(_arrays.quantity(a.below, args, symbols))
        if kwargs.get(pname) is None:
            raise NoBreak(f"the base call gives no {pname}")
        v = np.array(kwargs[pname], dtype=np.int64)
        v.reshape(-1)[-1] = bound
        kwargs[pname] = v
        # The bound is a model's or a table's size: its value, which the offending id equals, may name it.
        others = words_of(a.below) + [str(bound)] + [q.name for q in params if q.find("ArrayOf") is not None
                                                      and q.find("ArrayOf").shape and a.below in q.find("ArrayOf").shape]
        return kwargs, [pname], [str(bound)], others

    if what == "keys":
        rel = p.rels[int(rest[0])]
        key, r = rel.pairs[int(rest[1])]
        if rel.base:
            full = ctx.loom.resolve_config(kwargs.get(rel.base, "default"), kwargs.get(pname))
            given = dict(kwargs.get(pname) or {})
        else:  # the mapping itself, its missing keys as the model built from it has them
            given = dict(kwargs[pname])
            full = dict(fn(**kwargs).config, **given)
        here, target = path_get(full, key), path_get(full, r.target)
        same_key = [r2 for k2, r2 in rel.pairs if k2 == key and r2 is not r]
        cands = [v for v in number_candidates(None, here, target) if v > 0]
        found = ([v for v in cands if not r.check(v, target) and all(
            r2.check(v, path_get(full, r2.target)) for r2 in same_key)] or [v for v in cands if not r.check(v, target)])
        if not found:
            raise NoBreak(f"no value of {key} breaks {r.text().format(key)}")
        given[key] = found[0]
        kwargs[pname] = given
        return kwargs, [pname, key, key.split(".")[-1]], [str(found[0])], [r.target, r.target.split(".")[-1]]

    rel = p.rels[int(rest[0])]
    name = type(rel).__name__
    if name == "Requires":
        if kwargs.get(pname) is None or kwargs.get(rel.target) is None:
            raise NoBreak(f"the base call must give both {pname} and {rel.target}")
        kwargs[rel.target] = None
        return kwargs, [pname], ["None"], [rel.target]
    if name == "SameShapes":
        base = kwargs.get(pname)
        if base is None and rel.target == "self":  # the module the base call builds: its own weights
            built = fn(**kwargs)
            base = built.state_dict()
        if base is None:
            raise NoBreak(f"the base call gives no {pname}")
        whole = dict(base) if isinstance(base, dict) else list(base)
        inner = whole[rel.of] if rel.of else whole
        inner = dict(inner) if isinstance(inner, dict) else list(inner)
        keys = list(inner) if isinstance(inner, dict) else range(len(inner))
        key = next((k for k in keys if inner[k] is not None and np.ndim(inner[k]) >= 1), None)
        if key is None:
            raise NoBreak(f"no array in the base {pname}")
        arr = np.asarray(inner[key])
        inner[key] = np.ascontiguousarray(resized(arr, 0, arr.shape[0] + 1, np))
        if rel.of:
            whole[rel.of] = inner
        else:
            whole = inner
        kwargs[pname] = whole
        # The entry changed may name the parameter for it ("token_embeddings.weight has shape ...").
        return (kwargs, [pname, str(key)] + ([rel.of] if rel.of else []),
                [str(inner[key].shape), str(list(inner[key].shape))], words_of(rel.target) + [pname])

    # Relations of values: search this parameter's valid values, then the other side's, for a pair that
    # breaks it (preferring one that keeps this parameter's other relations).
    def this_of(v):
        if rel.of in (None, "each"):
            return v
        return _arrays.quantity("v." + rel.of, {"v": v})

    def holds(v, t, r=rel):
        if r.of == "each":
            return all(r.check(x, t) for x in v)
        return r.check(this_of(v) if r is rel else (v if r.of is None else _arrays.quantity("v." + r.of, {"v": v})), t)

    def target_of(args_):
        try:
            return _arrays.quantity(rel.target, args_, symbols)
        except (KeyError, AttributeError) as e:
            raise NoBreak(f"{rel.target} cannot be read from the base call ({e})")

    base = kwargs.get(pname)
    target = target_of(args)
    if p.kind in ("int", "float") or rel.of == "each":
        probe = base[-1] if rel.of == "each" and base else base
        bound = target + rel.plus if isinstance(target, (int, float)) else target
        nums = number_candidates(None if rel.of == "each" else p, probe, bound)
        cands = [list(base) + [n] for n in nums] if rel.of == "each" else nums
    else:
        cands = pool_of(ctx, p, base)
    # Every other relation of the call must still hold, so that a refusal is this relation's.
    # (Those of this parameter against the same target are one rule in two strengths: 2 x num_heads divides
    # d_model cannot hold when num_heads does not.)
    others = [(q, r) for q in params for r in q.rels
              if r is not rel and type(r).__name__ not in ("Keys", "Requires", "SameShapes")
              and not (q is p and r.target == rel.target)]

    def isolated(args_):
        for q, r in others:
            try:
                v = args_.get(q.name)
                t = _arrays.quantity(r.target, args_, symbols)
                if v is not None and not holds(v, t, r):
                    return False
            except (KeyError, AttributeError, TypeError):  # a relation that cannot be read here does not decide
                pass
        return True

    def shown_of(v):
        if rel.of == "each":
            return [str(v[-1])]
        q = this_of(v)
        return [str(q)] if isinstance(q, (int, float, str)) else []

    # The other side: its name, or for a quantity that is no parameter of the call (self's, an attribute,
    # a shape symbol), its value.
    other_words = words_of(rel.target)
    if rel.target.split(".")[0] not in kwargs and isinstance(target, (int, float)):
        other_words.append(str(target))
    pick = next((v for v in cands if not holds(v, target) and isolated(dict(args, **{pname: v}))), None)
    if pick is not None:
        kwargs[pname] = pick
        # An attribute of the value changed (a mesh's tensor=4) may name it.
        return kwargs, [pname] + ([rel.of] if rel.of not in (None, "each") else []), shown_of(pick), other_words
    # The other side: a parameter named by the target, given another valid value.
    head = rel.target.split(".")[0]
    if head in kwargs and head != pname:
        other = next((q for q in params if q.name == head), None)
        if other is not None and other.kind in ("int", "float"):
            pool = number_candidates(other, kwargs[head], base)
        else:
            pool = pool_of(ctx, other, kwargs[head])
        for v in pool:
            args2 = dict(args, **{head: v})
            if not holds(base, target_of(args2)) and isolated(args2):
                kwargs[head] = v
                t2 = target_of(args2)
                return kwargs, [head], [str(t2)] if isinstance(t2, (int, float, str)) else [], [pname] + words_of(rel.of or "")
    raise NoBreak(f"no valid value of {pname} or {head} breaks {rel.text().format(pname)}")


# ---------------------------------------------------------------- judging (in the child)


def shows(value, msg, np, array_param=False):
    """Whether the message shows the value (its first 12 characters) or, for an array, its dtype or shape
    (for an array parameter given something else, that of np.asarray(value))."""
    if array_param and not isinstance(value, np.ndarray) and value is not None:
        if shows(value, msg, np):
            return True
        try:
            value = np.asarray(value)
        except Exception:  # noqa: BLE001 - not even an array: the parameter's name must do
            return True
    if isinstance(value, np.ndarray):
        shape = value.shape
        forms = [str(shape), "[" + ", ".join(map(str, shape)) + "]", str(value.dtype), value.dtype.name]
        return any(f in msg for f in forms)
    if isinstance(value, (dict, list)):
        return True  # a container is named by its parameter
    if value is None:
        return "None" in msg
    if isinstance(value, bytes):
        return repr(value)[:12] in msg or value.decode("utf-8", "replace")[:12] in msg or "bytes" in msg
    if isinstance(value, str):
        if value == "":
            return "''" in msg or '""' in msg or "empty" in msg
        return value[:12] in msg or repr(value)[:12] in msg or ww.escaped(value)[:12] in msg
    if isinstance(value, float) and math.isnan(value):
        return "nan" in msg.lower()
    if isinstance(value, float) and math.isinf(value):
        return "inf" in msg.lower()
    return str(value)[:12] in msg or ww.shows_number(str(value), msg)


def names(param, msg):
    if param == "self":
        return True
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(param) + r"(?![A-Za-z0-9])", msg) is not None


def same(a, b, np):
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], np) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, np) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and not isinstance(a, (int, float, str)) or a == b


def finite(result, np):
    if isinstance(result, np.ndarray):
        return result.dtype.kind not in "fc" or bool(np.all(np.isfinite(result)))
    if isinstance(result, float):
        return math.isfinite(result)
    if isinstance(result, (list, tuple)):
        return all(finite(r, np) for r in result)
    if isinstance(result, dict):
        return all(finite(r, np) for r in result.values())
    return True


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return 0


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def child_main(args):
    """Runs the cases named on stdin (JSON) in the scratch copy (the cwd); one line per start and result."""
    import itertools
    import numpy as np
    import loom

    items = dict(api(loom))
    ctx = Ctx(loom, np)
    bases = base_calls(ctx)
    state = json.load(open(args.child_state))
    before = {k: tuple(v) for k, v in state["before"].items()}
    hashes = state["hashes"]
    owned = [p[:-len("run.json")] for p in before if p.endswith("/run.json")]
    base_results = {}
    ctx.lm(), ctx.tok(), ctx.gpt2(), ctx.f(2)  # first uses import what they need
    import numpy.random  # noqa: F401
    import concurrent.futures  # noqa: F401 - imported before the privileges go
    import inspect  # noqa: F401
    if args.child_uid >= 0:
        os.setgroups([])
        os.setgid(args.child_uid)
        os.setuid(args.child_uid)
    out = sys.stdout

    def emit(kind, obj):
        out.write(kind + " " + json.dumps(obj) + "\n")
        out.flush()

    for case in json.loads(sys.stdin.read()):
        cid, qual, pname, variant = case
        emit("S", cid)
        t0 = time.time()
        shutil.rmtree("new/case", ignore_errors=True)
        os.makedirs("new/case", exist_ok=True)
        verdict, detail, reason = judge_case(ctx, items, bases, base_results, qual, pname, variant, np, itertools)
        changed = ww.changes(".", before, hashes)
        if changed:
            allowed = []
            if verdict == "accepted":
                p = next((p for p in items.get(qual, []) if not isinstance(items[qual], str) and p.name == pname), None)
                target = None
                if p is not None and p.kind == "path" and variant.startswith("out:") and p.find("Writes").kind == "file":
                    target = OUTPUTS[variant.split(":", 1)[1]][0]
                for ch in changed:
                    what, path = ch.split(" ", 1)
                    if what == "changed" and path == target:
                        allowed.append(ch)
                    elif what == "created" and not any(path.startswith(o) for o in owned):
                        allowed.append(ch)
            rest = [ch for ch in changed if ch not in allowed]
            if rest:
                verdict, detail = "FAIL-changed", "; ".join(rest[:6]) + (f" and {len(rest) - 6} more" if len(rest) > 6 else "")
            emit("R", [cid, verdict, detail, reason, round(time.time() - t0, 3)])
            return 3  # the tree changed: the parent copies it afresh
        emit("R", [cid, verdict, detail, reason, round(time.time() - t0, 3)])
    return 0


def judge_case(ctx, items, bases, base_results, qual, pname, variant, np, itertools):
    params = items[qual]
    if qual not in bases:
        return "FAIL-harness", f"no base call for {qual} in tools/wrong_way_python.py's BASE", ""
    if isinstance(params, str):
        return "FAIL-harness", f"{qual}: {params}", ""

    def call(fn, kwargs, positional):
        pos = [kwargs.pop(n) for n in positional if n in kwargs]
        r = fn(*pos, **kwargs)
        if hasattr(r, "__next__"):
            r = list(itertools.islice(r, 10**6))
        return r

    positional = [p.name for p in params if p.positional]
    try:
        fn, kwargs = bases[qual]()
    except Exception as e:  # noqa: BLE001 - the base objects themselves failed
        return "FAIL-base", f"building the base call: {type(e).__name__}: {str(e)[:300]}", ""
    if variant == "base":
        try:
            base_results[qual] = call(fn, dict(kwargs), positional)
        except Exception as e:  # noqa: BLE001
            return "FAIL-base", f"the base call raised {type(e).__name__}: {str(e)[:300]}", ""
        return "accepted", "", "the base call"
    if variant == "nan-weights":
        fn = getattr(ctx.nan_run() if qual.startswith("Run.") else ctx.nan_lm(), qual.split(".")[-1])
        value, may, reason = None, False, ""
    elif variant.startswith("conflict:"):
        try:
            kwargs, changed, shown_texts, other_words = break_relation(ctx, qual, params, fn, kwargs, pname, variant, np)
        except NoBreak as e:
            return "FAIL-harness", f"{variant}: {e}", ""
        value, may, reason = kwargs.get(changed[0]), False, ""
    elif variant == "all-empty-last":
        kwargs = dict(kwargs)
        for p in params:
            kind = p.find("ArrayOf").kind if p.find("ArrayOf") else ""
            if p.kind == "array" and kind == "float" and kwargs.get(p.name) is not None:
                kwargs[p.name] = np.asarray(kwargs[p.name])[..., :0]
        value, may = None, True
        reason = "numpy's semantics: arrays empty along the last axis (checked: result finite)"
    else:
        p = next(p for p in params if p.name == pname)
        base_value = kwargs.get(pname)
        if base_value is None and p.kind in ("int", "float"):
            import inspect
            try:
                base_value = inspect.signature(fn).parameters[pname].default
            except (ValueError, KeyError):
                base_value = None
        value = make_value(variant, p, base_value if base_value is not None else np.zeros(3, np.float32), np)
        may, reason = expectation(p, variant, base_value)
        kwargs = dict(kwargs)
        kwargs[pname] = value
    reset_peak()
    # A value that asks for long work (max_new_tokens at its bound) is stopped after --stop-after seconds
    # by a signal, as Ctrl-C would stop it: work that never looks at signals is the parent's hang.
    signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, ARGS_STOP_AFTER[0])
    try:
        result = call(fn, kwargs, positional)
    except Stopped:
        if not may:
            return "FAIL-accepted", f"still running after {ARGS_STOP_AFTER[0]:.0f} s on a value that is never right", ""
        return "accepted", "", reason + f" (long work: stopped by a signal after {ARGS_STOP_AFTER[0]:.0f} s)"
    except ALLOWED as e:
        msg = str(e)
        problems = []
        if len(msg) > 2000:
            problems.append(f"{len(msg)} characters long")
        if variant.startswith("conflict:"):
            if not any(names(n, msg) for n in changed):
                problems.append(f"names no {' or '.join(repr(n) for n in changed)}")
            if shown_texts and not any(t in msg or ww.shows_number(t, msg) for t in shown_texts):
                problems.append(f"does not show the value ({' or '.join(shown_texts)})")
            if other_words and not any(names(w, msg) for w in other_words):
                problems.append(f"names no {' or '.join(repr(w) for w in other_words)} (the other side)")
        elif variant == "all-empty-last":
            if not msg.startswith(qual.split(".")[-1]):
                problems.append(f"the message is not {qual.split('.')[-1]}'s own (a kernel's, below it)")
        elif variant != "nan-weights":
            if not names(pname, msg):
                problems.append(f"names no '{pname}'")
            if not shows(value, msg, np, array_param=p.kind == "array"):
                problems.append("does not show the value")
        elif "finite" not in msg and "nan" not in msg.lower():
            problems.append("does not say the weights or logits are not finite")
        if problems:
            return "FAIL-message", "; ".join(problems) + f": {type(e).__name__}: {ww.escaped(msg)[:300]}", ""
        if peak_rss_mib() > ARGS_MAX_RSS[0]:
            return "FAIL-memory", f"peak RSS {peak_rss_mib()} MiB", ""
        return "refused", f"{type(e).__name__}: {ww.escaped(msg)[:300]}", ""
    except BaseException as e:  # noqa: BLE001 - any other type is a finding
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return "FAIL-type", f"{type(e).__name__}: {ww.escaped(str(e))[:300]}", ""
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if peak_rss_mib() > ARGS_MAX_RSS[0]:
        return "FAIL-memory", f"peak RSS {peak_rss_mib()} MiB", ""
    if not may:
        if variant.startswith("conflict:"):
            return "FAIL-accepted", f"returned {ww.escaped(repr(result))[:120]} for values that break {variant}", ""
        return "FAIL-accepted", f"returned {ww.escaped(repr(result))[:120]} for a value that is never right", ""
    if variant in ("0-d", "py-scalar") and isinstance(result, np.ndarray) and result.shape == (1,):
        return "FAIL-result", "a 0-d array came back as shape (1,)", ""
    if variant.startswith(("empty-", "all-empty")) and not finite(result, np):
        return "FAIL-result", f"an empty array gave a non-finite result {ww.escaped(repr(result))[:120]}", ""
    if variant in ("noncontig", "nested-list") and qual in base_results and not same(result, base_results[qual], np):
        if not qual.endswith((".__init__", ".step", "load_state_dict")) and "save" not in qual and qual != "train":
            return "FAIL-result", "not the base call's result for the same values", ""
    return "accepted", "", reason


ARGS_MAX_RSS = [2048]
ARGS_STOP_AFTER = [10.0]


class Stopped(BaseException):
    """Raised by the SIGALRM handler in a case that runs past --stop-after."""


def _stop(signum, frame):
    raise Stopped()


# ---------------------------------------------------------------- the parent


def make_python_scratch(root, pythonpath):
    """The Python-only artifacts: a checkpoint of the base TransformerLM and GPT-2 vocab/merges files."""
    code = ("import loom, numpy as np\n"
            "m = loom.TransformerLM(64, 16, 16, 1, 2, 32, seed=1)\n"
            "loom.save_checkpoint(m, None, 3, 'py/ckpt.safetensors')\n"
            "loom.Tokenizer.from_file('data/austen_bpe512/tokenizer.json').save_gpt2('py/gpt2')\n"
            "loom.Tokenizer({i: bytes([i]) for i in range(256)}, []).save_gpt2('py/gpt2-bytes')\n")
    os.makedirs(os.path.join(root, "py"))
    env = ww.child_env()
    env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"wrong_way_python: setup failed:\n{r.stderr[-3000:]}")


class Worker(ww.Worker):
    def state_file(self):
        path = self.root + ".state.json"
        with open(path, "w") as f:
            json.dump({"before": self.before, "hashes": self.hashes}, f)
        os.chmod(path, 0o644)
        return path


def run_batch(worker, cases, args, results, log):
    """Runs `cases` in child processes on `worker`'s copy until all have a verdict."""
    pending = list(cases)
    while pending:
        state = worker.state_file()
        limit = args.address_space_gib << 30

        def preexec():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))

        env = ww.child_env()
        env["PYTHONPATH"] = args.pythonpath
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        err = open(worker.root + ".stderr", "wb")
        # The interpreter may live where `nobody` cannot read (root's pyenv): the child starts as this user
        # and becomes `nobody` itself once it has imported what it needs (--child-uid).
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-state", state,
                              "--max-rss-mib", str(args.max_rss_mib), "--stop-after", str(args.stop_after), "--child-uid", str(worker.uid or -1)],
                             cwd=worker.root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                             preexec_fn=preexec, start_new_session=True)
        p.stdin.write(json.dumps([list(c) for c in pending]).encode())
        p.stdin.close()
        started, buf, done_ids = None, b"", set()
        deadline = time.time() + args.timeout + 30  # the first case also pays for the imports
        hung = False
        while True:
            r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.time()))
            if not r:
                hung = True
                os.killpg(p.pid, signal.SIGKILL)
                break
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                kind, payload = line.decode().split(" ", 1)
                obj = json.loads(payload)
                if kind == "S":
                    started = obj
                    deadline = time.time() + args.timeout
                else:
                    cid, verdict, detail, reason, seconds = obj
                    case = next(c for c in pending if c[0] == cid)
                    results.append((case, verdict, detail, reason, seconds))
                    done_ids.add(cid)
                    started = None
                    if verdict.startswith("FAIL"):
                        log(f"{verdict}: {label(case)}: {detail}")
        status = p.wait()
        err.close()
        pending = [c for c in pending if c[0] not in done_ids]
        if started is not None:
            case = next(c for c in pending if c[0] == started)
            if hung:
                verdict, detail = "FAIL-hang", f"no result after {args.timeout:.0f} s"
            elif status < 0:
                verdict, detail = "FAIL-crash", f"the child died of signal {-status}"
            else:
                with open(worker.root + ".stderr", "rb") as f:
                    tail = f.read()[-600:].decode("utf-8", "replace")
                verdict, detail = "FAIL-crash", f"the child exited {status} mid-case: {tail}"
            results.append((case, verdict, detail, "", args.timeout if hung else 0.0))
            log(f"{verdict}: {label(case)}: {detail}")
            pending = [c for c in pending if c[0] != started]
            worker.reset()
        elif status == 3:
            worker.reset()
        elif status != 0 or pending:
            with open(worker.root + ".stderr", "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            raise SystemExit(f"wrong_way_python: a child exited {status} between cases:\n{tail}")


def label(case):
    cid, qual, pname, variant = case
    return f"{qual}({pname}={variant})" if pname else f"{qual} {variant}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"), help="the CLI, to build the scratch run")
    ap.add_argument("--pythonpath", default=os.path.join(ROOT, "build", "python"), help="where the loom package is")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a case may run")
    ap.add_argument("--address-space-gib", type=int, default=8, help="RLIMIT_AS of each child")
    ap.add_argument("--max-rss-mib", type=int, default=2048, help="peak resident memory a case may reach")
    ap.add_argument("--stop-after", type=float, default=10.0, help="seconds after which a case is stopped by a signal")
    ap.add_argument("--only", default="", help="run only the cases whose label contains this text")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--report", default="", help="write every case and its verdict to this JSON file")
    ap.add_argument("--child-state", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-uid", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    ARGS_MAX_RSS[0] = args.max_rss_mib
    ARGS_STOP_AFTER[0] = args.stop_after
    if args.child_state:
        return child_main(args)
    args.pythonpath = os.path.abspath(args.pythonpath)
    sys.path.insert(0, args.pythonpath)
    import loom

    def log(msg):
        print(msg, flush=True)

    items = api(loom)
    cases = [c for c in generate_cases(items) if args.only in label(c)]
    if args.list:
        for c in cases:
            print(label(c))
        print(f"{len(cases)} cases over {len(items)} callables")
        return 0
    t0 = time.time()
    scratch = tempfile.mkdtemp(prefix="loom-wrong-way-py-")
    os.chmod(scratch, 0o755)
    pristine = os.path.join(scratch, "s")
    os.makedirs(pristine)
    ww.make_scratch(os.path.abspath(args.loom), pristine, log)
    make_python_scratch(pristine, args.pythonpath)
    log(f"wrong_way_python: {len(cases)} cases over {len(items)} callables, {args.jobs} at a time "
        f"(setup {time.time() - t0:.0f} s, scratch {scratch})")
    workers = [Worker(pristine, i, None, args) for i in range(args.jobs)]
    # The base calls first, then the cases of each callable together (they share its base objects), the
    # callables dealt out to the workers by turns.
    by_qual = collections.OrderedDict()
    for c in cases:
        by_qual.setdefault(c[1], []).append(c)
    shares = [[] for _ in workers]
    for i, group in enumerate(by_qual.values()):
        shares[i % len(workers)].extend(group)
    results = []
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        futures = []
        for w, share in zip(workers, shares):
            batches = [share[i:i + 150] for i in range(0, len(share), 150)]
            futures.append(pool.submit(lambda w=w, batches=batches: [run_batch(w, b, args, results, log) for b in batches]))
        for f in futures:
            f.result()
    counts = collections.Counter(v for _, v, _, _, _ in results)
    fails = [r for r in results if r[1].startswith("FAIL")]
    slowest = sorted(results, key=lambda r: -r[4])[:3]
    log(f"wrong_way_python: {len(results)} cases over {len(by_qual)} callables in {time.time() - t0:.0f} s: " +
        ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    reasons = collections.Counter(r for _, v, _, r, _ in results if v == "accepted")
    log("accepted because: " + "; ".join(f"{n} {r}" for r, n in reasons.most_common()))
    log("slowest: " + "; ".join(f"{label(c)[:60]} {s:.1f} s" for c, _, _, _, s in slowest))
    if args.report:
        with open(args.report, "w") as f:
            json.dump([{"case": label(c), "verdict": v, "detail": d, "reason": r, "seconds": s}
                       for c, v, d, r, s in sorted(results)], f, indent=1)
    if not args.keep:
        ww.remove_scratch(scratch)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
