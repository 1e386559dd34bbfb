"""Argument conversion at the boundary: anything array-like in, C-contiguous arrays of the exact dtype
the extension expects out. Integer ids are range-checked before they are narrowed to int32."""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import numbers
import os
import re
import types
import typing
from typing import Annotated, Union

import numpy as np
from numpy.typing import ArrayLike

_I32 = np.iinfo(np.int32)


# Arrays past this many bytes are held to the memory budget before they are converted or copied.
_CHECK_BYTES = 64 << 20


def _fits_memory(a: np.ndarray, name: str, itemsize: int) -> None:
    """A conversion that would copy more than loom may use (the smallest of MemAvailable, the cgroup's room
    and RLIMIT_AS/RLIMIT_DATA: runs/memory.h) is a ValueError naming the array, not a MemoryError or a
    minutes-long pass over a broadcast view."""
    fits_budget(a.size * itemsize, f"{name} has shape {a.shape} ({a.size} elements as "
                f"{np.dtype(np.float32 if itemsize == 4 else np.bool_).name})")


def fits_budget(need: float, what: str) -> None:
    """A ValueError "WHAT: needs N GiB, more than the M GiB loom may use (source)" past the budget."""
    if need <= _CHECK_BYTES:
        return
    from . import _loom
    budget, source = _loom.memory_budget()
    if need > budget:
        raise ValueError(f"{what}: needs {need / 2**30:.3g} GiB, more than the {budget / 2**30:.3g} GiB loom may "
                         f"use ({source})")


def _as_array(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise ValueError(f"{name} is not an array: {e}") from None


def f32(x, name: str = "x") -> np.ndarray:
    a = _as_array(x, name)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be a numeric array, got dtype {a.dtype} shape {a.shape}")
    _fits_memory(a, name, 4)
    return np.asarray(a, dtype=np.float32, order="C")  # ascontiguousarray makes 0-d arrays 1-d


def i32(x, name: str = "ids") -> np.ndarray:
    a = _as_array(x, name)
    if a.size == 0 and a.dtype.kind == "f":  # [] is float64 to numpy; no ids is no ids
        a = a.astype(np.int32)
    if a.dtype.kind not in "iub":
        raise ValueError(f"{name} must be an integer array, got dtype {a.dtype} shape {a.shape}")
    _fits_memory(a, name, 4)
    if a.size and a.dtype.itemsize >= 4 and a.dtype != np.int32:
        lo, hi = int(a.min()), int(a.max())
        if lo < _I32.min or hi > _I32.max:
            raise ValueError(f"{name} ({a.dtype} {a.shape}) holds values in [{lo}, {hi}], outside int32")
    return np.asarray(a, dtype=np.int32, order="C")


def boolean(x, name: str = "mask") -> np.ndarray:
    a = _as_array(x, name)
    if a.dtype.kind not in "biu":
        raise ValueError(f"{name} must be a boolean array, got dtype {a.dtype} shape {a.shape}")
    _fits_memory(a, name, 1)
    return np.asarray(a, dtype=np.bool_, order="C")


def inplace_f32(x, name: str) -> np.ndarray:
    """An array the extension updates in place: must already be float32, C-contiguous and writeable."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy array updated in place, got {type(x).__name__}")
    if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(
            f"{name} must be a writeable, C-contiguous float32 array to be updated in place "
            f"(got dtype {x.dtype}, contiguous={x.flags.c_contiguous}, writeable={x.flags.writeable})"
        )
    return x


# ---- what each public parameter takes, declared in its annotation ----
# The declarations are read twice: by `checked` (below), which refuses a value outside them before any
# work, naming the parameter and the value, and by tools/wrong_way_python.py, which generates its wrong-way
# cases from the signatures and accepts a call only for a value the declaration allows.


class Range:
    """An int or float parameter's closed range; None: unbounded on that side. NaN and inf are never in it."""

    def __init__(self, lo=None, hi=None, lo_open=False, hi_open=False):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def __repr__(self):
        return self.text()

    def text(self):
        lo = "-inf" if self.lo is None else self.lo
        hi = "inf" if self.hi is None else self.hi
        return f"{'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"

    def __contains__(self, v):
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        return above and below


class Text:
    """A str parameter any text is right for (empty and long ones too), as opposed to a name or choice."""

    def __repr__(self):
        return "Text()"


class Reads:
    """A path parameter read as one of these kinds: "safetensors", "loom-weights", "run", "gguf", "hf",
    "tokenizer", "gpt2-vocab", "gpt2-merges", "text", "config"."""

    def __init__(self, *kinds):
        self.kinds = kinds

    def __repr__(self):
        return f"Reads{self.kinds}"


class Writes:
    """A path parameter written: a file (kind "file", replaced when it exists, as numpy.save and torch.save
    replace theirs, but never inside a loom run directory) or a directory ("dir")."""

    def __init__(self, kind="file"):
        self.kind = kind

    def __repr__(self):
        return f"Writes({self.kind!r})"


class ArrayOf:
    """An array-like parameter converted to "float" (float32), "int" (int32 ids) or "bool", and what its
    shape and values must agree with (relations between the arrays and values of one call):

      shape        one symbol per dimension, "..., T, C"; "..." stands for any leading dimensions. Arrays of
                   one call that share a symbol must agree on it ("..." too: equal leading dimensions).
      equal        {symbol: path}: the dimension equals that quantity ({"C": "self.config.d_model"});
      at_most      {symbol: path}: the dimension is at most it ({"T": "self.config.context_length"});
      multiple_of  {symbol: path}: the dimension divides by it ({"B": "self.mesh.data*self.mesh.expert"});
      below        a symbol or path: every value (an id) lies in [0, it) ("V", "self.config.vocab_size");
                   `ignore`: a value exempt from it (cross_entropy's ignore_index).

    A path names a parameter, an attribute or key of one ("model.config.vocab_size"), self's, or a
    symbol; "*" multiplies (see `quantity`)."""

    def __init__(self, kind, shape=None, equal=None, at_most=None, multiple_of=None, below=None, ignore=None):
        self.kind, self.below, self.ignore = kind, below, ignore
        self.shape = tuple(d.strip() for d in shape.split(",")) if shape else None
        self.equal, self.at_most, self.multiple_of = dict(equal or {}), dict(at_most or {}), dict(multiple_of or {})

    def __repr__(self):
        extra = "".join(f", {k}={v!r}" for k, v in (("shape", ",".join(self.shape) if self.shape else None),
                                                     ("equal", self.equal), ("at_most", self.at_most),
                                                     ("multiple_of", self.multiple_of), ("below", self.below))
                        if v)
        return f"ArrayOf({self.kind!r}{extra})"


# ---- relations between the parameters of one call ----
# Declared in a parameter's annotation next to its Range, as ArrayOf declares its shape: what the value
# must agree with among the other arguments (or self). A value may be right alone and wrong together:
# n_head must divide n_embd, min_lr may not pass max_lr, a tokenizer's ids must fit the model's vocab.
# `checked` enforces those between two plain numbers of one call (or between given and None); the others
# (arrays, objects, self) the function itself checks, where it knows the shapes. tools/wrong_way_python.py
# reads every one and calls each callable with a value that breaks it while every value alone is right.


def quantity(path: str, args: dict, symbols: dict | None = None):
    """The value `path` names among the call's arguments `args` (self included): "d_model" (a parameter or
    a shape symbol), "model.config.vocab_size" (then attributes, or keys of a mapping), "special_tokens.len"
    (a length), "self.mesh.data*self.mesh.expert" (a product), or an integer literal."""
    if "*" in path:
        out = 1
        for part in path.split("*"):
            out *= quantity(part.strip(), args, symbols)
        return out
    if path.lstrip("-").isdigit():
        return int(path)
    head, *rest = path.split(".")
    if head in args:
        v = args[head]
    elif symbols is not None and head in symbols:
        v = symbols[head]
    else:
        raise KeyError(path)
    for part in rest:
        if part == "len":
            v = len(v)
        elif isinstance(v, collections.abc.Mapping):
            v = v[part]
        else:
            v = getattr(v, part)
    return v


class Relation:
    """This parameter's value (or its attribute `of`) against the quantity `target` (a path, see quantity).
    `unless`: a value of this parameter for which it always holds (num_kv_heads=0: as many as num_heads).
    A parameter given None takes no part."""

    words = "?"

    def __init__(self, target: str, of: str | None = None, unless=None, times: int = 1, plus: int = 0):
        self.target, self.of, self.unless, self.times, self.plus = target, of, unless, times, plus

    def holds(self, value, target) -> bool:
        raise NotImplementedError

    def check(self, value, target) -> bool:
        if value is None or target is None or (self.unless is not None and value == self.unless):
            return True
        return self.holds(value, target)

    def text(self) -> str:
        times = f"{self.times} x " if self.times != 1 else ""
        plus = f" + {self.plus}" if self.plus else ""
        return f"{times}{{}} {self.words} {self.target}{plus}"

    def __repr__(self):
        return f"{type(self).__name__}({self.target!r}{f', of={self.of!r}' if self.of else ''})"


class Divides(Relation):
    """times x this divides target (num_heads divides d_model; times=2: heads of even size)."""
    words = "must divide"

    def holds(self, value, target):
        return value > 0 and target % (self.times * value) == 0


class MultipleOf(Relation):
    """this is a multiple of target (n_routed of mesh.expert)."""
    words = "must be a multiple of"

    def holds(self, value, target):
        return target > 0 and value % target == 0


class AtMost(Relation):
    words = "must be at most"

    def holds(self, value, target):
        return value <= target + self.plus


class AtLeast(Relation):
    words = "must be at least"

    def holds(self, value, target):
        return value >= target + self.plus


class Below(Relation):
    words = "must be below"

    def holds(self, value, target):
        return value < target + self.plus


class Equal(Relation):
    words = "must equal"

    def holds(self, value, target):
        return value == target + self.plus


class Axis(Relation):
    """An axis of an array of target dimensions: in [-target, target) (softmax's dim)."""
    words = "must be an axis: in [-n, n) for n ="

    def holds(self, value, target):
        return -target <= value < target


class Requires(Relation):
    """Given (not None) only together with the parameter `target` (positions needs theta)."""
    words = "is used only with"

    def check(self, value, target):
        return value is None or target is not None

    def message(self, name, value, target):
        return f"{name} is used only with {self.target}, which is None: give {self.target} too"


class SameShapes(Relation):
    """Arrays (a sequence or a mapping of them; with `of`, the value's entry `of`) with the shapes of
    target's, one for one: gradients of their parameters, a state dict of its module ("self")."""
    words = "must have the shapes of"

    def holds(self, value, target):
        def shapes(v):
            if hasattr(v, "state_dict"):
                v = v.state_dict()
            items = v.items() if isinstance(v, collections.abc.Mapping) else enumerate(v)
            return {k: None if a is None else np.shape(a) for k, a in items}
        a, b = shapes(value), shapes(target)
        return a.keys() == b.keys() and all(a[k] is None or b[k] is None or a[k] == b[k] for k in a)


class Keys(Relation):
    """Relations between keys of a config mapping, each (key, Relation whose target is a key):
    Keys(("num_heads", Divides("d_model")), ...). With `base`, the mapping holds overrides of the config
    given as that parameter (a preset, a file or a mapping; "section.key" names)."""
    words = "must keep"

    def __init__(self, *pairs, base: str | None = None):
        super().__init__(base or "self")
        self.pairs, self.base = pairs, base

    def check(self, value, target):
        return True  # the config's own validation (train/config.cpp) checks them, naming the keys


def _relation_error(fn_name, name, value, rel, target):
    said = rel.message(name, value, target) if hasattr(rel, "message") else f"{rel.text().format(name)}={shown(target)}"
    return ValueError(f"{fn_name}: {name}={shown(value)}: {said}")


FloatArray = Annotated[ArrayLike, ArrayOf("float")]
IntArray = Annotated[ArrayLike, ArrayOf("int")]
BoolArray = Annotated[ArrayLike, ArrayOf("bool")]
Path = Union[str, os.PathLike]

# loom computes in float32: a float past its largest value would arrive as inf.
F32_MAX = float(np.finfo(np.float32).max)
POSITIVE = Range(0, F32_MAX, lo_open=True)
NONNEGATIVE = Range(0, F32_MAX)
SIZE = Range(1, 2**31 - 1)  # a model or batch dimension
COUNT = Range(0, 2**63 - 1)
SEED = Range(0, 2**64 - 1)  # seeds are uint64 in the library
THREADS = Range(0, 1024)     # core/thread_count.h kMaxThreads; 0: every core, more than the cores is clamped with a note
INT32 = Range(-(2**31), 2**31 - 1)
INT64 = Range(-(2**63), 2**63 - 1)


def printable(message: str) -> str:
    """A message as the CLI prints one (cli/main.cpp's printable_message): a word longer than 160
    characters cut to its first 80 and its length, control characters and lone surrogates escaped."""
    words = []
    for w in message.split(" "):
        w = w.encode("utf-8", "backslashreplace").decode("utf-8")
        w = "".join(c if c >= " " and c != "\x7f" else repr(c)[1:-1] for c in w)
        words.append(w if len(w) <= 160 else f"{w[:80]}... ({len(w)} characters)")
    return " ".join(words)


def shown(value, limit: int = 80) -> str:
    """A value as a message shows it: repr, cut to `limit` characters and its length."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def _arms(hint):
    """The arms of a union; Annotated[A | B, meta] as Annotated[A, meta], Annotated[B, meta]."""
    if typing.get_origin(hint) is Annotated:
        inner, *meta = typing.get_args(hint)
        # (a Path and an ArrayLike are unions too, but each one kind)
        if typing.get_origin(inner) in (Union, types.UnionType) and inner != Path and inner != ArrayLike:
            return tuple(Annotated[(a, *meta)] for a in typing.get_args(inner))
        return (hint,)
    if typing.get_origin(hint) in (Union, types.UnionType):
        return tuple(a for h in typing.get_args(hint) for a in _arms(h))
    return (hint,)


def _fits(hint, value) -> bool:
    """Whether `value` is of the kind `hint` names, roughly (a union's arm is picked by it)."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if hint is type(None):
        return value is None
    if hint == Path:
        return isinstance(value, (str, bytes, os.PathLike))
    if hint is ArrayLike or hint is object:
        return value is not None
    if hint in (int, float, bool):
        return isinstance(value, (numbers.Real, np.bool_))  # the Range and type checks say what is wrong
    if hint in (str, bytes):
        return isinstance(value, hint)
    origin = typing.get_origin(hint) or hint
    if origin in (collections.abc.Mapping, dict):
        return isinstance(value, collections.abc.Mapping)
    if origin in (collections.abc.Sequence, collections.abc.Iterable, list, tuple):
        return isinstance(value, collections.abc.Iterable) and not isinstance(value, (str, bytes, collections.abc.Mapping))
    if isinstance(origin, type):
        return isinstance(value, origin)
    return True


def _check(fn_name: str, name: str, hint, value):
    """Raises TypeError/ValueError unless `value` fits the annotation `hint` of parameter `name`."""
    def where():  # built only for an error: repr of a large array costs ~100 us
        return f"{fn_name}: {name}={shown(value)}"

    arms = _arms(hint)
    fitting = [a for a in arms if _fits(a, value)]
    if not fitting:
        names = ", ".join("None" if a is type(None) else getattr(typing.get_args(a)[0] if typing.get_origin(a) is Annotated
                                                                 else a, "__name__", str(a)) for a in arms)
        raise TypeError(f"{where()}: must be {names}, not {type(value).__name__}")
    hint = fitting[0]
    if value is None:
        return
    meta = ()
    if typing.get_origin(hint) is Annotated:
        hint, *meta = typing.get_args(hint)
    if hint is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{where()}: must be True or False")
        return
    if hint in (int, float):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or (
                hint is int and not isinstance(value, numbers.Integral)):
            raise TypeError(f"{where()}: must be {'an integer' if hint is int else 'a number'}, not "
                            f"{type(value).__name__}")
        if hint is float:
            try:
                v = float(value)
            except OverflowError:
                raise ValueError(f"{where()}: is past a float's range") from None
            if not math.isfinite(v):
                raise ValueError(f"{where()}: must be a finite number")
        for m in meta:
            if isinstance(m, Range) and value not in m:
                raise ValueError(f"{where()}: must be in {m.text()}")
        return
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"{where()}: must be a str, not {type(value).__name__}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where()}: is not valid text (a lone surrogate at {e.start})") from None
        if not any(isinstance(m, Text) for m in meta) and (value == "" or "\0" in value):
            raise ValueError(f"{where()}: must not be empty or hold a NUL character")
        return
    if hint == Path:
        p = os.fspath(value)
        if not isinstance(p, str):
            raise TypeError(f"{where()}: must be a str path, not {type(p).__name__}")
        if p == "":
            raise ValueError(f"{where()}: the path is empty")
        if "\0" in p:
            raise ValueError(f"{where()}: the path holds a NUL character")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where()}: the path is not valid UTF-8 (byte at {e.start})") from None
        return


def relations_of(hint) -> list:
    """The Relation declarations in an annotation (in any arm of a union)."""
    out = []
    for a in _arms(hint):
        if typing.get_origin(a) is Annotated:
            out += [m for m in typing.get_args(a)[1:] if isinstance(m, Relation) and not any(m is o for o in out)]
    return out


def _bare(hint):
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def _restated(e: BaseException, fn_name: str, texts: dict, arrays: dict) -> BaseException:
    """`e` as one readable line (printable), led by "fn: name='path'" when it shows a path argument's value
    without naming its parameter; the same exception type where it can be built from a message."""
    msg = str(e)
    text = printable(msg)

    def named(n):
        return re.search(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])", msg) is not None

    def shows(v):  # the value as a whole word of the message (its first 60 characters for a long one)
        end = "" if len(v) > 60 else r"(?![A-Za-z0-9_])"
        return re.search(r"(?<![A-Za-z0-9_])" + re.escape(v[:60]) + end, text) is not None

    lead = [f"{n}={shown(v)}" for n, v in texts.items() if v and shows(v) and not named(n)]
    if lead:
        text = f"{fn_name}: {', '.join(lead)}: {text}"
    if isinstance(e, ValueError) and arrays:
        # A shape error from an op names its own operands ("linear: w must have 2 dimensions"): the call's
        # arrays, by the parameter names given, with their dtypes and shapes, as numpy's errors show them.
        missing = [n for n, a in arrays.items() if not named(n) or str(a.shape) not in text]
        if missing:
            text += " (" + ", ".join(f"{n}: {a.dtype} {a.shape}" for n, a in arrays.items()) + ")"
    if text == msg:
        return e
    try:
        out = type(e)(text)
    except Exception:  # noqa: BLE001 - a type that needs more than a message
        out = (ValueError if isinstance(e, ValueError) else RuntimeError)(text)
    return out


def checked(fn):
    """Checks every argument of `fn` against its annotation (Range, Text, Path, bool, None) before the call."""
    sig = inspect.signature(fn)
    hints = None
    fn_name = fn.__qualname__.replace(".__init__", "").lstrip("_")

    def plan_of(hint):
        """A cheap check for the common case: an array-like (only None is wrong, unless it is Optional)."""
        arms = _arms(hint)
        if all(_bare(a) is ArrayLike or a is type(None) for a in arms):
            optional = type(None) in arms
            return lambda name, value: optional or value is not None or _check(fn_name, name, hint, value)
        return lambda name, value: _check(fn_name, name, hint, value)

    defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    relations = None
    array_params = set()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal hints, relations
        if hints is None:
            found = typing.get_type_hints(fn, include_extras=True)
            hints = {n: plan_of(h) for n, h in found.items() if n not in ("self", "return")}
            # The relations between two plain arguments (no attribute, no self, no array symbol).
            relations = [(n, r) for n, h in found.items() for r in relations_of(h)
                         if r.of is None and r.target in sig.parameters and r.target != "self" and not isinstance(r, Keys)]
            array_params.update(n for n, h in found.items() if any(_bare(a) is ArrayLike for a in _arms(h)))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{fn_name}: {e}") from None
        arguments = bound.arguments
        for name, value in arguments.items():
            check = hints.get(name)
            if check is not None:
                check(name, value)
        for name, rel in relations:
            value = arguments.get(name, defaults.get(name))
            target = arguments.get(rel.target, defaults.get(rel.target))
            # Between numbers only (and given / None): objects and arrays are the function's to check.
            if not isinstance(rel, Requires) and not (isinstance(value, numbers.Real) and isinstance(target, numbers.Real)):
                continue
            if not rel.check(value, target):
                raise _relation_error(fn_name, name, value, rel, target)
        # The texts and paths given, which a library error names by their value (as the CLI's do): the
        # error then also names the parameter; and the arrays, whose shapes a shape error is given.
        texts, arrays = {}, {}
        for n, v in arguments.items():
            if isinstance(v, np.ndarray):
                arrays[n] = v
            elif n in array_params and isinstance(v, numbers.Number):  # a number given as an array is a 0-d one
                arrays[n] = np.asarray(v)
            elif isinstance(v, (str, os.PathLike)) and n != "self" and isinstance(os.fspath(v), str):
                texts[n] = os.fspath(v)
        bound = arguments = name = value = v = target = rel = None
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, OSError, RuntimeError) as e:
            del args, kwargs
            raise _restated(e, fn_name, texts, arrays) from None
        except BaseException:
            # The traceback keeps this frame (a REPL keeps the last traceback): it must not keep the
            # arguments, a model among them, alive (Model.generate interrupted by Ctrl-C).
            del args, kwargs
            raise

    return wrapper
