"""The byte-level BPE tokenizer (GPT-2's semantics; CS336's Tokenizer interface) and BPE training."""

from __future__ import annotations

import os
from typing import Annotated, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import _loom
from ._arrays import THREADS, AtLeast, Below, Path, Range, Reads, Relation, Text, Writes, _check, checked, shown

CHUNK = Range(1, 1 << 40)
VOCAB = Range(256, 2**31 - 1)  # the 256 bytes come first


class MergesIn(Relation):
    """Merges whose two sides and result are tokens of the vocabulary `target`: a mapping id -> bytes, or
    (for paths) GPT-2's vocab.json beside a merges.txt."""
    words = "must name tokens of"

    def holds(self, merges, vocab):
        if isinstance(vocab, (str, os.PathLike)):
            import json
            with open(vocab, encoding="utf-8") as f:
                tokens = set(json.load(f))
            with open(merges, encoding="utf-8") as f:
                pairs = [line.split() for line in f if line.strip() and not line.startswith("#version")]
        else:
            tokens = {bytes(b) for b in vocab.values()}
            pairs = [(bytes(a), bytes(b)) for a, b in merges]
        return all(len(p) == 2 and p[0] in tokens and p[1] in tokens and p[0] + p[1] in tokens for p in pairs)


class Tokenizer:
    """Byte-level BPE: vocab (id -> token bytes), merges (pairs of token bytes, by rank) and special
    tokens (text that always becomes its own id and never takes part in a merge)."""

    @checked
    def __init__(self, vocab: Mapping[int, bytes], merges: Annotated[Sequence[tuple[bytes, bytes]], MergesIn("vocab")],
                 special_tokens: Sequence[str] | None = None):
        n = len(vocab)
        if sorted(vocab) != list(range(n)):
            raise ValueError(f"Tokenizer: vocab ids must be 0..{n - 1} without gaps")
        table = [bytes(vocab[i]) for i in range(n)]
        ids = {b: i for i, b in enumerate(table)}
        specials = list(special_tokens or [])
        for s in specials:  # CS336: special tokens missing from the vocabulary are appended
            b = s.encode("utf-8")
            if b not in ids:
                ids[b] = len(table)
                table.append(b)
        pairs = []
        for rank, (a, b) in enumerate(merges):
            outside = [t for t in (a, b, a + b) if t not in ids]
            if outside:
                raise ValueError(f"Tokenizer: merges[{rank}] = ({a!r}, {b!r}) needs {outside[0]!r}, which is not in vocab "
                                 f"({n} tokens): a merge joins two tokens of the vocabulary into a third")
            pairs.append((ids[a], ids[b]))
        self._t = _loom.Tokenizer(table, pairs, specials)

    @classmethod
    def _wrap(cls, t) -> "Tokenizer":
        self = cls.__new__(cls)
        self._t = t
        return self

    @classmethod
    @checked
    def from_file(cls, path: Annotated[Path, Reads("tokenizer", "gpt2-dir")],
                  special_tokens: Sequence[str] | None = None) -> "Tokenizer":
        """A Hugging Face tokenizer.json, or a directory holding GPT-2's vocab.json + merges.txt."""
        t = cls._wrap(_loom.load_tokenizer(os.fspath(path)))
        return t._with_specials(special_tokens)

    @classmethod
    @checked
    def from_files(cls, vocab_filepath: Annotated[Path, Reads("gpt2-vocab")],
                   merges_filepath: Annotated[Path, Reads("gpt2-merges"), MergesIn("vocab_filepath")],
                   special_tokens: Sequence[str] | None = None) -> "Tokenizer":
        """GPT-2's vocab.json (byte-level text -> id) and merges.txt ("a b" per line)."""
        t = cls._wrap(_loom.tokenizer_from_gpt2_files(os.fspath(vocab_filepath), os.fspath(merges_filepath)))
        return t._with_specials(special_tokens)

    def _with_specials(self, special_tokens):
        if special_tokens:
            self._t = self._t.with_special_tokens(list(special_tokens))
        return self

    # ---- the vocabulary ----
    @property
    def vocab_size(self) -> int:
        return int(self._t.vocab_size)

    @property
    def vocab(self) -> dict[int, bytes]:
        return dict(enumerate(self._t.vocab_bytes()))

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        table = self._t.vocab_bytes()
        return [(table[a], table[b]) for a, b in self._t.merge_ids()]

    @property
    def special_tokens(self) -> list[str]:
        return list(self._t.special_tokens())

    @checked
    def token_id(self, token: bytes) -> int | None:
        return self._t.token_id(bytes(token))

    @checked
    def special_token_id(self, text: Annotated[str, Text()]) -> int | None:
        return self._t.special_token_id(text)

    # ---- encode / decode ----
    @checked
    def encode(self, text: Annotated[str, Text()], threads: Annotated[int, THREADS] = 1) -> list[int]:
        """Token ids of `text`. threads=1 (the default) encodes on the calling thread and starts no
        thread; threads=0 uses every core for a large text (same ids)."""
        return self._t.encode(text, int(threads)).tolist()

    @checked
    def encode_array(self, text: Annotated[str, Text()], threads: Annotated[int, THREADS] = 1) -> np.ndarray:
        """encode() as an int32 numpy array (no Python list in between)."""
        return self._t.encode(text, int(threads))

    def encode_iterable(self, iterable: Iterable[str], chunk_bytes: Annotated[int, CHUNK] = 1 << 16) -> Iterator[int]:
        """Lazily yields the ids of the concatenation of the strings (e.g. the lines of an open file),
        exactly encode("".join(iterable))'s, holding only about chunk_bytes of unencoded text at a time
        (plus the longest pre-token). Starts no thread."""
        # A generator runs nothing until it is iterated: these are checked when it starts.
        _check("Tokenizer.encode_iterable", "chunk_bytes", Annotated[int, CHUNK], chunk_bytes)
        if not isinstance(iterable, Iterable) or isinstance(iterable, bytes):
            raise TypeError(f"Tokenizer.encode_iterable: iterable={shown(iterable)}: must be an iterable of str")
        enc = _loom.StreamEncoder(self._t, int(chunk_bytes))
        for piece in iterable:
            ids = enc.feed(piece)
            if ids.size:
                yield from ids.tolist()
        yield from enc.finish().tolist()

    @checked
    def decode(self, ids: Annotated[Iterable[int], Below("self.vocab_size", of="each")]) -> str:
        """The text of the ids; invalid UTF-8 becomes U+FFFD (Python's errors="replace")."""
        return self._t.decode([int(i) for i in ids])

    @checked
    def decode_bytes(self, ids: Annotated[Iterable[int], Below("self.vocab_size", of="each")]) -> bytes:
        return self._t.decode_bytes([int(i) for i in ids])

    @checked
    def save(self, path: Annotated[Path, Writes("file")]) -> None:
        """Writes a Hugging Face tokenizer.json."""
        self._t.save(os.fspath(path))

    @checked
    def save_gpt2(self, directory: Annotated[Path, Writes("dir")]) -> None:
        """Writes directory/vocab.json and directory/merges.txt."""
        self._t.save_gpt2(os.fspath(directory))


@checked
def train_bpe(input_path: Annotated[Path, Reads("text")] | Sequence[Path],
              vocab_size: Annotated[int, VOCAB, AtLeast("special_tokens.len", plus=256)],
              special_tokens: Sequence[str] = (), threads: Annotated[int, THREADS] = 0
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Byte-level BPE training with CS336's semantics: the vocabulary starts with the special tokens, then
    the 256 bytes, then one token per merge, until vocab_size tokens; ties go to the lexicographically
    greatest pair. input_path: a text file (or a list of files). Returns (vocab, merges) as bytes."""
    paths = [os.fspath(p) for p in input_path] if isinstance(input_path, (list, tuple)) else [os.fspath(input_path)]
    t = Tokenizer._wrap(_loom.train_bpe(paths, int(vocab_size), list(special_tokens), int(threads)))
    return t.vocab, t.merges
