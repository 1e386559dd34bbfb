"""Models of every family (Model.from_config), the Llama-style TransformerLM (CS336's model) and its
TransformerBlock, and trained runs.

Weights are numpy arrays under their dotted names: the CS336 names for the Llama family
(token_embeddings.weight, layers.{i}.attn.{q,k,v,output}_proj.weight, layers.{i}.ln{1,2}.weight,
layers.{i}.ffn.{w1,w2,w3}.weight, ln_final.weight, lm_head.weight; a lone block's names drop the
"layers.{i}." prefix), and those in src/models/gpt2/model.h for GPT-2.
  * state_dict() returns copies; parameters() returns live views of the model's own memory (writing to
    them, e.g. with AdamW.step, changes the model). load_state_dict() copies values in.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Mapping

import numpy as np

from . import _loom
from numpy.typing import ArrayLike

from ._arrays import (COUNT, INT32, NONNEGATIVE, POSITIVE, SEED, SIZE, ArrayOf, AtMost, Below, Divides, FloatArray,
                      IntArray, Keys, Path, Range, Reads, Relation, SameShapes, Text, Writes, checked, f32, i32, shown)

MAX_NEW_TOKENS = Range(0, 1_000_000)  # generate/generate.h's kMaxNewTokens
TOP_P = Range(0, 1, lo_open=True)
# What a module's weights must match: its own parameters' shapes, one for one.
Weights = Annotated[Mapping[str, FloatArray], SameShapes("self")]
# Ids a model takes: [B, T] with T at most its context and every id in its vocabulary.
Ids = Annotated[ArrayLike, ArrayOf("int", "B, T", at_most={"T": "self.config.context_length"},
                                   below="self.config.vocab_size")]
Targets = Annotated[ArrayLike, ArrayOf("int", "B, T", below="self.config.vocab_size")]
# A Llama's heads: num_heads splits d_model into heads of even size (RoPE turns pairs); num_kv_heads
# divides num_heads (0: as many).
LLAMA_HEADS = (("num_heads", Divides("d_model")), ("num_heads", Divides("d_model", times=2)),
               ("num_kv_heads", Divides("num_heads", unless=0)))
from .data import check_device
from .tokenizer import Tokenizer


def _load_state(module, state: Mapping[str, np.ndarray], strict: bool, param: str = "state") -> None:
    """Copies `state` in; errors name the parameter it was given as (`state`, `weights`) and the entry."""
    names = list(module.parameter_names())
    if strict:
        missing = [n for n in names if n not in state]
        unexpected = [n for n in state if n not in names]
        if missing or unexpected:
            raise ValueError(f"load_state_dict: {param} is missing {missing}, has unexpected {unexpected}")
    for name, value in state.items():
        if name in names:
            try:
                module.load_parameter(name, f32(value, name))
            except ValueError as e:
                raise ValueError(f"{param}['{name}']: {e}") from None


class _Module:
    _m: object

    def parameter_names(self) -> list[str]:
        return list(self._m.parameter_names())

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the weights, by dotted name."""
        return dict(self._m.state_dict())

    def parameters(self) -> dict[str, np.ndarray]:
        """Live float32 views of the weights, by dotted name: in-place updates change the model."""
        return dict(self._m.parameters())

    @checked
    def load_state_dict(self, state: Weights, strict: bool = True) -> None:
        """Copies weights in by name. strict: every parameter must be given, and nothing else."""
        _load_state(self._m, state, strict)


class TransformerBlock(_Module):
    """Pre-norm block: h = x + attn(ln1(x)) (causal, RoPE), y = h + ffn(ln2(h)) (SwiGLU).
    Weights: attn.{q,k,v,output}_proj.weight, ln1.weight, ln2.weight, ffn.{w1,w2,w3}.weight."""

    @checked
    def __init__(self, d_model: Annotated[int, SIZE],
                 num_heads: Annotated[int, SIZE, Divides("d_model"), Divides("d_model", times=2)],
                 d_ff: Annotated[int, SIZE], max_seq_len: Annotated[int, SIZE],
                 rope_theta: Annotated[float, POSITIVE] = 10000.0, norm_eps: Annotated[float, POSITIVE] = 1e-5,
                 seed: Annotated[int, SEED] = 0, weights: Weights | None = None):
        self._config = {"d_model": int(d_model), "num_heads": int(num_heads), "d_ff": int(d_ff),
                        "max_seq_len": int(max_seq_len), "rope_theta": float(rope_theta), "norm_eps": float(norm_eps)}
        self._m = _loom.TransformerBlock(int(d_model), int(num_heads), int(d_ff), int(max_seq_len),
                                         float(rope_theta), float(norm_eps), int(seed))
        if weights is not None:
            _load_state(self._m, weights, True, "weights")

    @property
    def config(self) -> dict:
        """d_model, num_heads, d_ff, max_seq_len, rope_theta, norm_eps."""
        return dict(self._config)

    @checked
    def forward(self, x: Annotated[ArrayLike, ArrayOf("float", "..., T, C", equal={"C": "self.config.d_model"})],
                positions: Annotated[ArrayLike, ArrayOf("int", "T", below="self.config.max_seq_len")] | None = None
                ) -> np.ndarray:
        """x: [..., T, d_model]; positions: integer [T] or [..., T] (default 0..T-1), each below max_seq_len."""
        x = f32(x)
        if x.ndim < 2 or x.shape[-1] != self._config["d_model"]:
            raise ValueError(f"TransformerBlock.forward: x must be [..., T, d_model={self._config['d_model']}], got "
                             f"shape {x.shape}")
        lead, (t, c) = x.shape[:-2], x.shape[-2:]
        rows = int(np.prod(lead, dtype=np.int64))  # not -1: an empty x cannot infer it
        p = None
        if positions is not None:
            p = np.asarray(positions)
            if p.ndim > 1:
                p = np.broadcast_to(p, lead + (t,)).reshape((rows, t))
            p = i32(p, "positions")
        return self._m.forward(x.reshape((rows, t, c)), p).reshape(lead + (t, c))

    __call__ = forward


def _ids_2d(ids, name: str):
    a = i32(ids, name)
    if a.size == 0:
        raise ValueError(f"{name} has shape {a.shape}: a model needs at least one token")
    if a.ndim == 1:
        return a[None, :], True
    if a.ndim != 2:
        raise ValueError(f"{name} must be [T] or [B, T], got shape {a.shape}")
    return a, False


def _pair(inputs, targets):
    x, _ = _ids_2d(inputs, "inputs")
    y, _ = _ids_2d(targets, "targets")
    if x.shape != y.shape:
        raise ValueError(f"inputs has shape {x.shape} but targets has shape {y.shape}: they must be the same")
    return x, y


class Model(_Module):
    """A language model of any family (llama, gpt2, deepseek_v3), built from a config's "model" section."""

    def __init__(self, _wrap):
        self._m = _wrap

    @classmethod
    @checked
    def from_config(cls, config: Annotated[Mapping, Keys(("num_heads", Divides("d_model")))],
                    seed: Annotated[int, SEED] = 0, weights: Weights | None = None, device: str = "cpu") -> "Model":
        """From a dict of the model section's keys: "arch" picks the family (default "llama"); missing
        keys take the family's defaults. Weights are drawn from `seed` unless `weights` are given.
        device: "cpu"; "cuda[:N]" raises RuntimeError with the reason (see check_device)."""
        check_device(device, "Model")
        m = cls._wrap_native(_loom.build_model(json.dumps(dict(config)), int(seed)))
        if weights is not None:
            _load_state(m._m, weights, True, "weights")
        return m

    @classmethod
    @checked
    def load(cls, path: Annotated[Path, Reads("loom-weights")], device: str = "cpu") -> "Model":
        """A model from a loom weights file (model.safetensors, config in its metadata), on `device`
        (as in from_config)."""
        check_device(device, "Model.load")
        return cls._wrap_native(_loom.load_model_weights(os.fspath(path)))

    @staticmethod
    def _wrap_native(native) -> "Model":
        m = TransformerLM.__new__(TransformerLM) if native.arch == "llama" else Model.__new__(Model)
        m._m = native
        return m

    @checked
    def save(self, path: Annotated[Path, Writes("file")]) -> None:
        """Writes the weights, with the model config in the metadata, as loom's model.safetensors."""
        self._m.save(os.fspath(path))

    @property
    def arch(self) -> str:
        return str(self._m.arch)

    @property
    def config(self) -> dict:
        """The complete model section, "arch" included."""
        return json.loads(self._m.config_json)

    @property
    def num_params(self) -> int:
        return int(self._m.num_params)

    @checked
    def forward(self, ids: Ids) -> np.ndarray:
        """ids: integer [B, T] (or [T]), T <= context_length. Returns logits [B, T, V] (or [T, V])."""
        a, squeeze = _ids_2d(ids, "ids")
        y = self._m.forward(a)
        return y[0] if squeeze else y

    __call__ = forward

    @checked
    def loss(self, inputs: Ids, targets: Targets) -> float:
        """Mean next-token cross-entropy of forward(inputs) against targets (same shape)."""
        x, y = _pair(inputs, targets)
        return float(self._m.loss(x, y))

    @checked
    def loss_and_grads(self, inputs: Ids, targets: Targets) -> tuple[float, dict[str, np.ndarray]]:
        """The mean loss and its gradient for every parameter, by name (new arrays each call)."""
        x, y = _pair(inputs, targets)
        loss, grads = self._m.loss_and_grads(x, y)
        return float(loss), dict(grads)

    @checked
    def generate(self, prompt: Annotated[ArrayLike, ArrayOf("int", "T", below="self.config.vocab_size")],
                 max_new_tokens: Annotated[int, MAX_NEW_TOKENS] = 100,
                 temperature: Annotated[float, NONNEGATIVE] = 1.0, top_k: Annotated[int, COUNT] = 0,
                 top_p: Annotated[float, TOP_P] = 1.0, seed: Annotated[int, SEED] = 0,
                 stop_token: Annotated[int, INT32, Below("self.config.vocab_size")] | None = None) -> list[int]:
        """New token ids after `prompt` (ids), sampled with the decoding cache. temperature 0 is greedy;
        top_k 0 and top_p 1 are off; generation ends after stop_token when it is given."""
        p = i32(prompt, "prompt")
        if p.ndim != 1 or p.size == 0:
            raise ValueError(f"Model.generate: prompt must be a 1-D sequence of at least one id, got shape {p.shape}")
        p = p.tolist()
        vocab = self.config["vocab_size"]
        if stop_token is not None and stop_token >= vocab:
            # No id the model can sample: the generation would never stop there, silently.
            raise ValueError(f"Model.generate: stop_token={stop_token} is outside the model's vocabulary [0, "
                             f"vocab_size={vocab}): it could never be generated")
        args = (int(max_new_tokens), float(temperature), int(top_k), float(top_p), int(seed),
                -1 if stop_token is None else int(stop_token))
        # A KeyboardInterrupt's traceback keeps this frame, and a REPL keeps the last traceback
        # (sys.last_exc): the frame must not hold the model then, or `del model` frees nothing.
        native = self._m
        del self
        try:
            return list(native.generate(p, *args))
        except BaseException:
            del native
            raise


class TransformerLM(Model):
    """The Llama-style language model: embeddings, num_layers TransformerBlocks, a final RMSNorm and an
    untied lm_head. Weights are drawn from `seed` (per parameter name) unless `weights` are given."""

    @checked
    def __init__(self, vocab_size: Annotated[int, SIZE], context_length: Annotated[int, SIZE],
                 d_model: Annotated[int, SIZE], num_layers: Annotated[int, SIZE],
                 num_heads: Annotated[int, SIZE, Divides("d_model"), Divides("d_model", times=2)],
                 d_ff: Annotated[int, SIZE], rope_theta: Annotated[float, POSITIVE] = 10000.0,
                 norm_eps: Annotated[float, POSITIVE] = 1e-5, seed: Annotated[int, SEED] = 0,
                 weights: Weights | None = None,
                 num_kv_heads: Annotated[int, COUNT, Divides("num_heads", unless=0)] = 0,
                 _wrap: object = None, device: str = "cpu"):
        check_device(device, "TransformerLM")
        if _wrap is not None:
            self._m = _wrap
            return
        self._m = _loom.TransformerLM(int(vocab_size), int(context_length), int(d_model), int(num_layers),
                                      int(num_heads), int(d_ff), float(rope_theta), float(norm_eps), int(seed),
                                      int(num_kv_heads))
        if weights is not None:
            _load_state(self._m, weights, True, "weights")

    @classmethod
    @checked
    def from_config(cls, config: Annotated[Mapping, Keys(*LLAMA_HEADS)], seed: Annotated[int, SEED] = 0,
                    weights: Weights | None = None, device: str = "cpu") -> "TransformerLM":
        """From a dict with the keys of `config` (a training config's "model" section works too)."""
        keys = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff",
                "rope_theta", "norm_eps")
        return cls(**{k: config[k] for k in keys if k in config}, seed=seed, weights=weights, device=device)

    @classmethod
    @checked
    def load(cls, path: Annotated[Path, Reads("loom-weights")], device: str = "cpu") -> "TransformerLM":
        """A Llama from a loom weights file (model.safetensors, config in its metadata)."""
        m = Model.load(path, device=device)
        if not isinstance(m, TransformerLM):
            raise ValueError(f"{os.fspath(path)} holds a {m.arch} model, not a llama: use loom.Model.load")
        return m

    @property
    def config(self) -> dict:
        """The model section without "arch", num_kv_heads resolved (0 means num_heads)."""
        c = json.loads(self._m.config_json)
        c.pop("arch", None)
        if c.get("num_kv_heads", 0) == 0:
            c["num_kv_heads"] = c["num_heads"]
        return c


class Describes(Relation):
    """A training config (its "model" section) that describes the model `target`: every key both have is
    equal."""
    words = "must describe"

    @staticmethod
    def differences(config, model) -> dict:
        mine = json.loads(model._m.config_json)
        section = config.get("model", {}) if isinstance(config, Mapping) else {}
        return {k: (v, mine[k]) for k, v in section.items() if k in mine and mine[k] != v}

    def holds(self, value, target):
        return not self.differences(value, target)


class Run:
    """A trained run: its model, tokenizer and training config (when the run has them)."""

    @checked
    def __init__(self, model: Model,
                 tokenizer: Annotated[Tokenizer, AtMost("model.config.vocab_size", of="vocab_size")] | None,
                 config: Annotated[Mapping, Describes("model")] | None):
        # The tokenizer's ids must be rows of the model's embedding, and a config must describe this model:
        # a run assembled from two runs' parts would generate garbage or index past the vocabulary.
        vocab = model.config["vocab_size"]
        if tokenizer is not None and tokenizer.vocab_size > vocab:
            raise ValueError(f"Run: tokenizer has {tokenizer.vocab_size} tokens (vocab_size={tokenizer.vocab_size}), "
                             f"more than the model's vocab_size={vocab}: its ids past {vocab - 1} have no embedding")
        if config is not None and not Describes("model").check(config, model):
            raise ValueError(f"Run: config's model section disagrees with the model on {Describes.differences(config, model)} "
                             "(config value, model value): give the config the model was trained with")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config

    def _tok(self):
        if self.tokenizer is None:
            raise ValueError("this run has no tokenizer.json")
        return self.tokenizer

    @checked
    def loss(self, text: Annotated[str, Text()]) -> float:
        """Mean next-token loss on `text`, over consecutive windows of up to context_length tokens."""
        ids = np.asarray(self._tok().encode(text), dtype=np.int32)
        if ids.size < 2:
            raise ValueError(f"Run.loss: text={shown(text)} encodes to {ids.size} tokens; the loss needs at least 2")
        t = self.model.config["context_length"]
        total, count = 0.0, 0
        for s in range(0, ids.size - 1, t):
            window = ids[s:s + t + 1]
            n = window.size - 1
            total += self.model.loss(window[:-1], window[1:]) * n
            count += n
        return total / count

    @checked
    def generate(self, prompt: Annotated[str, Text()], max_new_tokens: Annotated[int, MAX_NEW_TOKENS] = 100,
                 temperature: Annotated[float, NONNEGATIVE] = 0.8, top_k: Annotated[int, COUNT] = 0,
                 top_p: Annotated[float, TOP_P] = 1.0, seed: Annotated[int, SEED] = 0) -> str:
        """The text the model writes after `prompt` (not including it); stops at <|endoftext|>."""
        tok, model = self._tok(), self.model
        del self  # as in Model.generate: an interrupted call's traceback must not keep the run's model
        eot = tok.special_token_id("<|endoftext|>")
        encoded = tok.encode(prompt)
        if not encoded:
            raise ValueError(f"Run.generate: prompt={shown(prompt)} encodes to no tokens: give some text")
        try:
            ids = model.generate(encoded, max_new_tokens, temperature, top_k, top_p, seed, eot)
        except BaseException:
            del model
            raise
        return tok.decode(ids)


@checked
def load_run(path: Annotated[Path, Reads("run", "loom-weights", "hf", "gguf")]) -> Run:
    """A run directory written by `loom train` or loom.train (model.safetensors, tokenizer.json,
    config.json), a weights file (a tokenizer.json beside it is loaded too), a Hugging Face directory,
    or a GGUF file (weights dequantized to f32, the tokenizer from its metadata)."""
    path = os.fspath(path)
    model, tok, cfg = _loom.load_run(path, os.path.isfile(path))
    return Run(Model._wrap_native(model),
               None if tok is None else Tokenizer._wrap(tok),
               None if cfg is None else json.loads(cfg))
