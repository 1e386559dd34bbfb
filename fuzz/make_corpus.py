#!/usr/bin/env python3
"""Makes the seed corpora of the config and tokenizer fuzz targets (tools/fuzz.sh):

    python3 fuzz/make_corpus.py

  corpus/config/*.json           configs: small valid ones, wrong types, out-of-range numbers, and JSON
                                 nested far past io/json.h's limit of 64 (which once crashed `loom train`)
  corpus/tokenizer_json/*.json   tokenizer.json and vocab.json files: valid ones, broken ones, deep ones

Deterministic, so rerunning changes nothing. Every seed stays within the target's -max_len (4096 bytes
for config, 16384 for tokenizer_json): libFuzzer cuts longer seeds.
"""
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        f.write(text)


def nested_arrays(depth):
    return "[" * depth + "]" * depth


def nested_objects(depth):
    return '{"a":' * depth + "1" + "}" * depth


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (tokenizer/byte_level.h)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def config_seeds():
    d = os.path.join(HERE, "corpus", "config")
    write(d, "empty.json", "{}")
    write(d, "small.json", json.dumps({"model": {"d_model": 64, "num_heads": 4, "num_layers": 1},
                                       "training": {"max_steps": 3, "threads": 1, "precision": "bf16"}}))
    write(d, "wrong_types.json", json.dumps({"model": {"d_model": "64"}, "optimizer": {"lr": [1]}}))
    write(d, "unknown_key.json", json.dumps({"model": {"dmodel": 64}}))
    write(d, "seed_past_2_64.json", '{"training": {"seed": 1e30}}')
    write(d, "threads_too_many.json", '{"training": {"threads": 100000}}')
    write(d, "deep_arrays.json", '{"model": ' + nested_arrays(2000) + "}")
    write(d, "deep_objects.json", '{"model": ' + nested_objects(650) + "}")
    # Brackets inside a string are not nesting: this one is a valid config.
    write(d, "brackets_in_string.json", json.dumps({"description": "[" * 1000 + "\\\"{" * 100}))
    write(d, "unterminated_string.json", '{"description": "' + "x" * 3000)


def tokenizer_seeds():
    d = os.path.join(HERE, "corpus", "tokenizer_json")
    shutil.copyfile(os.path.join(ROOT, "tests", "tokenizer", "hf_tokenizer.json"), os.path.join(d, "hf_tokenizer.json"))
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab[b2u[ord("t")] + b2u[ord("h")]] = 256
    vocab["<|endoftext|>"] = 257
    write(d, "vocab.json", json.dumps(vocab, ensure_ascii=False))
    write(d, "deep_vocab.json", '{"a": ' + nested_arrays(3000) + "}")
    hf = {"model": {"type": "BPE", "vocab": {b2u[b]: b for b in range(256)}, "merges": []},
          "added_tokens": [{"id": 0, "content": "<|endoftext|>"}]}
    write(d, "minimal_hf.json", json.dumps(hf, ensure_ascii=False))
    # One id far past the number of entries: the reader once sized its table by it (43 GB).
    hf["model"]["vocab"]["zz"] = 1344444440
    write(d, "id_past_the_entries.json", json.dumps(hf, ensure_ascii=False))
    write(d, "deep_added_tokens.json", '{"model": {"type": "BPE", "vocab": {}, "merges": []}, "added_tokens": [{"id": '
          + nested_arrays(3000) + "}]}")
    write(d, "deep_merges.json", '{"model": {"type": "BPE", "vocab": {}, "merges": [' + nested_objects(1500) + "]}}")
    write(d, "wrong_types.json", json.dumps({"model": {"type": 1, "vocab": {}, "merges": []},
                                             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "no"}}))


if __name__ == "__main__":
    os.makedirs(os.path.join(HERE, "corpus", "tokenizer_json"), exist_ok=True)
    config_seeds()
    tokenizer_seeds()
