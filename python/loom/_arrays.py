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
    """An array-like parameter converted to "float" (float32), "int" (int32 ids) or "bool"."""

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"ArrayOf({self.kind!r})"


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
    return typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)


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

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal hints
        if hints is None:
            found = typing.get_type_hints(fn, include_extras=True)
            hints = {n: plan_of(h) for n, h in found.items() if n not in ("self", "return")}
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{fn_name}: {e}") from None
        arguments = bound.arguments
        for name, value in arguments.items():
            check = hints.get(name)
            if check is not None:
                check(name, value)
        # The texts and paths given, which a library error names by their value (as the CLI's do): the
        # error then also names the parameter; and the arrays, whose shapes a shape error is given.
        texts, arrays = {}, {}
        for n, v in arguments.items():
            if isinstance(v, np.ndarray):
                arrays[n] = v
            elif isinstance(v, (str, os.PathLike)) and n != "self" and isinstance(os.fspath(v), str):
                texts[n] = os.fspath(v)
        bound = arguments = name = value = v = None
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
