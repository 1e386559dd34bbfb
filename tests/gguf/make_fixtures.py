#!/usr/bin/env python3
"""Makes the GGUF test corpus and fixtures: the format's for tests/gguf, beside this file, and a tiny
Llama's for the family's GGUF tests in tests/models/llama (also read by tests/generate and
tests/benchmark). The oracle for the format is PyPI's `gguf` package (the llama.cpp project's own Python
reader/writer); the oracle for the model is transformers' Llama.

    python3 -m venv --system-site-packages /tmp/tfvenv     # torch 1.13 from the system
    /tmp/tfvenv/bin/pip install gguf==0.19.0 transformers==4.46.3
    /tmp/tfvenv/bin/python tests/gguf/make_fixtures.py

Writes (deterministic, so rerunning changes nothing), under tests/gguf/:
  corpus/valid/*.gguf            files written by gguf.GGUFWriter that must load (also the fuzz seeds)
  corpus/malformed/*.gguf        hand-built files, one per rule the reader enforces, that must be refused
  fixtures/values.json           what gguf.GGUFReader reads from corpus/valid: every metadata value with its
                                 type, every tensor's type, ne and values (dequantized by gguf.quants)
  fixtures/malformed_expected.json   for each malformed file, text its error message must contain
and under tests/models/llama/:
  fixtures/tiny_llama.gguf       a 2-layer Llama (GQA, tied head, Q8_0/Q4_1/F16/F32 tensors) with a
                                 byte-level BPE tokenizer in its metadata, written as llama.cpp's
                                 convert_hf_to_gguf.py writes one: q/k rows permuted from HF's order
  fixtures/tiny_llama.json       transformers' LlamaForCausalLM logits for it (from the same dequantized
                                 weights, HF layout), and the tokenizer's ids on a few texts (tokenizers'
                                 BPE built the way transformers builds it from GGUF metadata)
  fixtures/tokenizer_*.json      the same vocabulary (it lacks bytes 0x04, 0x05, 0x7f) as tokenizer.json with
                                 unk_token fused, unfused and absent; tiny_llama.json has tokenizers' ids

With --check-loom-gguf FILE it instead reads a GGUF that loom wrote with gguf.GGUFReader and prints what
it holds (the oracle for loom's writer; not run in CI).
"""
import json
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT

HERE = os.path.dirname(os.path.abspath(__file__))
VALID = os.path.join(HERE, "corpus", "valid")
MALFORMED = os.path.join(HERE, "corpus", "malformed")
FIXTURES = os.path.join(HERE, "fixtures")
LLAMA_FIXTURES = os.path.normpath(os.path.join(HERE, "..", "models", "llama", "fixtures"))


def write_with_gguf(path, arch, kvs, tensors):
    """kvs: [(key, value, GGUFValueType or None, sub_type)]; tensors: [(name, float32 array, type)]."""
    w = gguf.GGUFWriter(path, arch)
    for key, value, vtype, sub in kvs:
        if key == "general.alignment":
            w.add_custom_alignment(value)  # also sets the writer's data alignment
        else:
            w.add_key_value(key, value, vtype, sub_type=sub)
    for name, arr, qtype in tensors:
        if qtype in (Q.F32, Q.F16):
            data = arr.astype(np.float32 if qtype == Q.F32 else np.float16)
            w.add_tensor(name, data)
        elif arr.dtype == np.uint8:  # raw blocks already
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=qtype)
        else:
            data = gguf.quants.quantize(arr.astype(np.float32), qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def k_quant_blocks(seed, qtype, n_blocks):
    """Raw K-quant blocks (gguf cannot quantize to them): random bytes, with the f16 scales set to
    small finite values so that the dequantized numbers are finite."""
    size = {Q.Q4_K: 144, Q.Q6_K: 210}[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (n_blocks, size), dtype=np.uint8)
    scales = np.random.default_rng(seed + 100).uniform(0.001, 0.05, (n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin first
        raw[:, 0:4] = scales
    else:  # d last
        raw[:, 208:210] = scales[:, 0:2]
    return raw


def rng_values(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---- valid files --------------------------------------------------------------------------------

def make_valid():
    os.makedirs(VALID, exist_ok=True)
    files = {}
    # Every value type, arrays of each, an array of strings and arrays of arrays.
    kvs = [
        ("test.u8", 200, VT.UINT8, None), ("test.i8", -100, VT.INT8, None),
        ("test.u16", 60000, VT.UINT16, None), ("test.i16", -30000, VT.INT16, None),
        ("test.u32", 4000000000, VT.UINT32, None), ("test.i32", -2000000000, VT.INT32, None),
        ("test.f32", 0.1, VT.FLOAT32, None), ("test.bool", True, VT.BOOL, None),
        ("test.string", "naïve café — 日本語 🙂", VT.STRING, None),
        ("test.u64", 2**63 + 5, VT.UINT64, None), ("test.i64", -(2**62), VT.INT64, None),
        ("test.f64", 1e300, VT.FLOAT64, None),
        ("test.array_i32", [1, -2, 3], VT.ARRAY, VT.INT32),
        ("test.array_f32", [0.5, -1.25], VT.ARRAY, VT.FLOAT32),
        ("test.array_bool", [True, False, True], VT.ARRAY, VT.BOOL),
        ("test.array_string", ["a", "", "Ġthe"], VT.ARRAY, VT.STRING),
        ("test.nested", [[1, 2], [3]], VT.ARRAY, VT.ARRAY),
    ]
    tensors = [
        ("f32", rng_values(1, (3, 5)), Q.F32),
        ("f16", rng_values(2, (2, 4)), Q.F16),
        ("q8_0", rng_values(3, (2, 64)), Q.Q8_0),
        ("q4_1", rng_values(4, (2, 32)), Q.Q4_1),
        ("q4_0", rng_values(5, (1, 32)), Q.Q4_0),
        ("q5_0", rng_values(9, (1, 32)), Q.Q5_0),
        ("q5_1", rng_values(10, (2, 32)), Q.Q5_1),
        ("bf16", rng_values(11, (2, 3)), Q.BF16),
        ("q4_k", k_quant_blocks(12, Q.Q4_K, 2), Q.Q4_K),
        ("q6_k", k_quant_blocks(13, Q.Q6_K, 1), Q.Q6_K),
    ]
    files["all_types.gguf"] = (kvs, tensors)
    files["no_tensors.gguf"] = ([("test.u32", 7, VT.UINT32, None)], [])
    files["alignment_64.gguf"] = ([("general.alignment", 64, VT.UINT32, None)],
                                  [("a", rng_values(6, (7,)), Q.F32), ("b", rng_values(7, (2, 3)), Q.F32)])
    files["vector_1d.gguf"] = ([], [("v", rng_values(8, (33,)), Q.F32)])
    for name, (kv, ts) in files.items():
        write_with_gguf(os.path.join(VALID, name), "test", kv, ts)


def value_json(field):
    types = [t.name for t in field.types]
    return {"types": types, "value": field.contents()}


def describe_valid():
    out = {}
    for name in sorted(os.listdir(VALID)):
        r = gguf.GGUFReader(os.path.join(VALID, name))
        meta = {}
        for key, field in r.fields.items():
            if key.startswith("GGUF."):
                continue
            v = value_json(field)
            if isinstance(v["value"], float) and "FLOAT32" in v["types"]:
                v["value"] = float(np.float32(v["value"]))
            meta[key] = v
        tensors = []
        for t in r.tensors:
            values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            tensors.append({"name": t.name, "type": t.tensor_type.name, "ne": [int(d) for d in t.shape],
                            "offset": int(t.data_offset), "values": [float(x) for x in values]})
        out[name] = {"metadata": meta, "keys_in_order": [k for k in r.fields if not k.startswith("GGUF.")],
                     "tensors": tensors}
    return out


# ---- malformed files ----------------------------------------------------------------------------

def s(text):
    b = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", 4, v)


def header(n_tensors, n_kv, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def tinfo(name, ne, type_id, offset):
    return s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", type_id, offset)


def pad(b, a=32):
    return b + b"\0" * ((-len(b)) % a)


def one_tensor(ne=(4,), type_id=0, offset=0, data=None, kvs=b"", n_kv=0, name="t"):
    data = bytes(16) if data is None else data
    return pad(header(1, n_kv) + kvs + tinfo(name, ne, type_id, offset)) + data


def make_malformed():
    os.makedirs(MALFORMED, exist_ok=True)
    good = one_tensor()
    cases = {
        "empty.gguf": (b"", "truncated file"),
        "bad_magic.gguf": (b"GGUX" + good[4:], "not a GGUF file"),
        "version_1.gguf": (b"GGUF" + struct.pack("<I", 1) + good[8:], "GGUF version 1 is not supported"),
        "big_endian.gguf": (b"GGUF" + struct.pack(">I", 3) + good[8:], "big-endian"),
        "truncated_header.gguf": (good[:20], "truncated file"),
        "truncated_data.gguf": (good[:-1], "ends past the end of the file"),
        "huge_kv_count.gguf": (header(0, 2**63), "metadata entries cannot fit"),
        "huge_tensor_count.gguf": (header(2**40, 0) + bytes(64), "tensor infos cannot fit"),
        "huge_string.gguf": (header(0, 1) + struct.pack("<Q", 2**62) + bytes(20), "has length"),
        "huge_array.gguf": (header(0, 1) + s("a") + struct.pack("<IIQ", 9, 4, 2**61), "is an array of"),
        "huge_string_array.gguf": (header(0, 1) + s("a") + struct.pack("<IIQ", 9, 8, 2**40) + bytes(40),
                                   "is an array of"),
        "bad_value_type.gguf": (header(0, 1) + s("a") + struct.pack("<I", 13) + bytes(8), "unknown value type 13"),
        "bad_array_type.gguf": (header(0, 1) + s("a") + struct.pack("<IIQ", 9, 42, 1), "unknown value type 42"),
        "bool_2.gguf": (header(0, 1) + s("a") + struct.pack("<IB", 7, 2), "bool is 2"),
        "bool_array_3.gguf": (header(0, 1) + s("a") + struct.pack("<IIQ", 9, 7, 2) + b"\x01\x03", "is 3"),
        "empty_key.gguf": (header(0, 1) + kv_u32("", 1), "empty key"),
        "invalid_utf8_key.gguf": (header(0, 1) + s(b"a\xffb") + struct.pack("<II", 4, 1), "not valid UTF-8"),
        "duplicate_key.gguf": (header(0, 2) + kv_u32("a", 1) + kv_u32("a", 2), "appears twice"),
        "nested_too_deep.gguf": (header(0, 1) + s("a") + struct.pack("<I", 9) +
                                 struct.pack("<IQ", 9, 1) * 8 + struct.pack("<IQ", 4, 0), "nested more than"),
        "alignment_not_pow2.gguf": (one_tensor(kvs=kv_u32("general.alignment", 48), n_kv=1),
                                    "general.alignment\" is 48, expected a power of two"),
        "alignment_zero.gguf": (one_tensor(kvs=kv_u32("general.alignment", 0), n_kv=1), "general.alignment\" is 0"),
        "alignment_wrong_type.gguf": (one_tensor(kvs=s("general.alignment") + struct.pack("<IQ", 10, 32), n_kv=1),
                                      "expected a u32"),
        "unknown_ggml_type.gguf": (one_tensor(type_id=99), "99"),
        "unsupported_ggml_type.gguf": (one_tensor(type_id=16, ne=(256,), data=bytes(66)), "IQ2_XXS"),
        "zero_dims.gguf": (one_tensor(ne=()), "0 dimensions"),
        "five_dims.gguf": (one_tensor(ne=(1, 1, 1, 1, 4)), "5 dimensions"),
        "dim_zero.gguf": (one_tensor(ne=(4, 0)), "dimension of size 0"),
        "numel_overflow.gguf": (one_tensor(ne=(2**32, 2**32, 2**32)), "elements"),
        "bytes_overflow.gguf": (one_tensor(ne=(2**31, 2**31, 2**0 + 3), type_id=0), "2^6"),
        "row_bytes_overflow.gguf": (one_tensor(ne=(2**62,)), "rows of more than 2^63 bytes"),  # found by fuzzing
        "not_whole_blocks.gguf": (one_tensor(ne=(16,), type_id=8), "not a whole number of Q8_0 blocks"),
        "misaligned_offset.gguf": (one_tensor(offset=4, data=bytes(32)), "is at offset 4"),
        "tensor_past_end.gguf": (one_tensor(ne=(64,)), "ends past the end of the file"),
        "trailing_bytes.gguf": (good + bytes(64), "bytes after its last tensor"),
        "no_tensors_trailing.gguf": (pad(header(0, 0)) + bytes(100), "bytes after its tensor infos"),
        "duplicate_tensor.gguf": (pad(header(2, 0) + tinfo("t", (4,), 0, 0) + tinfo("t", (4,), 0, 32)) + bytes(48),
                                  "appears twice"),
        "overlapping_tensors.gguf": (pad(header(2, 0) + tinfo("a", (8,), 0, 0) + tinfo("b", (4,), 0, 0)) + bytes(64),
                                     "is at offset 0"),
        "long_tensor_name.gguf": (one_tensor(name="x" * 65), "65 bytes long"),
        "invalid_utf8_name.gguf": (one_tensor(name=b"\xc3\x28"), "not valid UTF-8"),
    }
    expected = {}
    for name, (data, text) in cases.items():
        with open(os.path.join(MALFORMED, name), "wb") as f:
            f.write(data)
        expected[name] = text
    return expected


# ---- the tiny Llama ------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_tokenizer():
    """Control tokens, then the byte tokens except three (0x04, 0x05, 0x7f: real vocabularies lack some),
    then a few merges learned by hand from common English pairs."""
    b2u = bytes_to_unicode()
    controls = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    missing = {0x04, 0x05, 0x7F}
    tokens = controls + [b2u[b] for b in range(256) if b not in missing]
    merges = []
    for a, b in [("t", "h"), ("th", "e"), ("Ġ", "th"), ("Ġth", "e"), ("i", "n"), ("Ġ", "a"), ("e", "r"),
                 ("Ġ", "s"), ("o", "n"), ("a", "n"), ("Ġa", "n"), ("Ġan", "d"), ("in", "g"), ("Ġ", "Ġ"),
                 ("ĠĠ", "ĠĠ"), ("Ċ", "Ċ"), ("Ġ", "1"), ("1", "2")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    types = [3] * len(controls) + [1] * (len(tokens) - len(controls))
    return tokens, merges, types


def permute_for_gguf(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens, merges, types = tiny_tokenizer()
    V, C, L, H, KV, F = len(tokens), 64, 2, 4, 2, 96
    D = C // H
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    # Norm gains away from 1, so that a mix-up of the two norms would show.
    rng = np.random.default_rng(3)
    for k in sd:
        if k.endswith("norm.weight"):
            sd[k] = (1.0 + 0.2 * rng.standard_normal(sd[k].shape)).astype(np.float32)
        elif sd[k].ndim == 2:
            sd[k] = (rng.standard_normal(sd[k].shape) * 0.08).astype(np.float32)

    # GGUF tensors (in HF->GGUF order: token_embd first, then per block), quantized as SmolLM2's file is.
    types_of = {"attn_q": Q.Q4_1, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0, "attn_output": Q.Q4_0,
                "ffn_gate": Q.Q4_1, "ffn_up": Q.F16, "ffn_down": Q.Q8_0}
    hf_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    tensors = [("token_embd.weight", sd["model.embed_tokens.weight"], Q.Q8_0)]
    for i in range(L):
        for g, hf in hf_names.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if g == "attn_q":
                w = permute_for_gguf(w, H)
            elif g == "attn_k":
                w = permute_for_gguf(w, KV)
            tensors.append((f"blk.{i}.{g}.weight", w, types_of.get(g, Q.F32)))
    tensors.append(("output_norm.weight", sd["model.norm.weight"], Q.F32))

    path = os.path.join(LLAMA_FIXTURES, "tiny_llama.gguf")
    kvs = [
        ("general.name", "tiny llama", VT.STRING, None),
        ("llama.block_count", L, VT.UINT32, None), ("llama.context_length", 128, VT.UINT32, None),
        ("llama.embedding_length", C, VT.UINT32, None), ("llama.feed_forward_length", F, VT.UINT32, None),
        ("llama.attention.head_count", H, VT.UINT32, None), ("llama.attention.head_count_kv", KV, VT.UINT32, None),
        ("llama.rope.freq_base", 10000.0, VT.FLOAT32, None),
        ("llama.attention.layer_norm_rms_epsilon", 1e-5, VT.FLOAT32, None),
        ("llama.vocab_size", V, VT.UINT32, None), ("llama.rope.dimension_count", D, VT.UINT32, None),
        ("tokenizer.ggml.model", "gpt2", VT.STRING, None), ("tokenizer.ggml.pre", "smollm", VT.STRING, None),
        ("tokenizer.ggml.tokens", tokens, VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.token_type", types, VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.merges", merges, VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.bos_token_id", 1, VT.UINT32, None), ("tokenizer.ggml.eos_token_id", 2, VT.UINT32, None),
        ("tokenizer.ggml.unknown_token_id", 0, VT.UINT32, None),
        ("tokenizer.chat_template", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}", VT.STRING, None),
    ]
    write_with_gguf(path, "llama", kvs, tensors)

    # The reference: transformers' Llama on the dequantized GGUF weights, un-permuted back to HF's order
    # exactly as transformers' own GGUF loader does (so loom, which does not permute, must agree).
    r = gguf.GGUFReader(path)
    deq = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
        [int(d) for d in reversed(t.shape)]) for t in r.tensors}
    inv = {v: k for k, v in hf_names.items()}

    def unpermute(w, n_head):
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    new_sd = {}
    for k in sd:
        if k == "model.embed_tokens.weight" or k == "lm_head.weight":
            new_sd[k] = deq["token_embd.weight"]
        elif k == "model.norm.weight":
            new_sd[k] = deq["output_norm.weight"]
        else:
            layer, rest = k.split(".")[2], ".".join(k.split(".")[3:-1])
            w = deq[f"blk.{layer}.{inv[rest]}.weight"]
            if rest == "self_attn.q_proj":
                w = unpermute(w, H)
            elif rest == "self_attn.k_proj":
                w = unpermute(w, KV)
            new_sd[k] = w
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new_sd.items()})
    ids = [[1, 40, 90, 120, 200, 33, 260, 5, 77, 2, 150, 151, 17, 64, 99, 250]]
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits[0].numpy()

    # Tokenization oracle: tokenizers' BPE built as transformers 4.46's GGUF converter builds it for a
    # Llama-architecture file with a gpt2 tokenizer (unk = tokenizer.ggml.unknown_token_id, fused; control
    # tokens special; ByteLevel pre-tokenizer without prefix space).
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    tk = Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges],
                       unk_token=tokens[0], fuse_unk=True, byte_fallback=True))
    tk.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i, t in enumerate(types) if t == 3])
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    texts = ["the thing and the sand", "  indented\n\n\tcode = 12 + 1", "a\x04b\x05\x05c\x7f!", "naïve café 日本 🙂",
             "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "112 1212 x1"]
    encodings = [{"text": t, "ids": tk.encode(t).ids} for t in texts]

    # The same vocabulary as HF tokenizer.json files, with the unknown token set three ways: how loom
    # reads a tokenizer.json whose vocabulary lacks some bytes is checked against tokenizers itself.
    variants = {}
    for name, unk, fuse in [("unk_fused", tokens[0], True), ("unk_unfused", tokens[0], False), ("no_unk", None, False)]:
        v = Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges],
                          unk_token=unk, fuse_unk=fuse))
        v.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                              for i, t in enumerate(types) if t == 3])
        v.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        v.decoder = decoders.ByteLevel()
        v.save(os.path.join(LLAMA_FIXTURES, f"tokenizer_{name}.json"))
        variants[name] = [v.encode(t).ids for t in texts]
    return {"ids": ids[0], "logits": [[float(x) for x in row] for row in logits], "vocab_size": V,
            "tokenizer": encodings, "tokenizer_json": variants}


def check_loom_gguf(path):
    r = gguf.GGUFReader(path)
    for key, field in r.fields.items():
        v = field.contents()
        if isinstance(v, list) and len(v) > 8:
            v = f"[{len(v)} items] {v[:4]}..."
        print(key, [t.name for t in field.types], v)
    for t in r.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        print(t.name, t.tensor_type.name, [int(d) for d in t.shape], "mean|x| %.6g" % float(np.abs(values).mean()))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check-loom-gguf":
        check_loom_gguf(sys.argv[2])
        return
    os.makedirs(FIXTURES, exist_ok=True)
    os.makedirs(LLAMA_FIXTURES, exist_ok=True)
    make_valid()
    expected = make_malformed()
    with open(os.path.join(FIXTURES, "values.json"), "w") as f:
        json.dump(describe_valid(), f, indent=1, ensure_ascii=False)
    with open(os.path.join(FIXTURES, "malformed_expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    with open(os.path.join(LLAMA_FIXTURES, "tiny_llama.json"), "w") as f:
        json.dump(make_tiny_llama(), f)
    print("wrote", VALID, MALFORMED, FIXTURES, LLAMA_FIXTURES)


if __name__ == "__main__":
    main()
