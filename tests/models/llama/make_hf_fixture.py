#!/usr/bin/python3
"""Writes tests/models/llama/fixtures/hf_tiny/: a small Hugging Face Llama directory that loom did not write,
plus the loss an independent PyTorch implementation of HF's Llama forward computes on a token file.

Run with Debian's python (torch 1.13): /usr/bin/python3 tests/models/llama/make_hf_fixture.py

Everything here is independent of loom: the weights are drawn by torch, stored under HF's names in HF's
layout (rotate-half RoPE, [out, in] Linear weights) by a hand-written safetensors writer, and the forward
follows transformers' modeling_llama.py (LlamaRMSNorm, rotate_half / apply_rotary_pos_emb, causal
softmax attention, SiLU-gated MLP), in float64. The C++ test imports the directory into loom and checks
that `loom eval` gives the same loss and that the logits agree.

It also writes fixtures/hf_tiny_gqa/ (grouped-query attention: 2 key/value heads for 4 query heads, k/v
heads repeated as transformers' repeat_kv does) and fixtures/hf_reference_gqa.json.
"""
import json
import math
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "hf_tiny")

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500.0,  # not the default, so that a wrong theta shows
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
T = 16  # evaluation window


def write_safetensors(path, tensors):
    """The safetensors format: u64 header length, JSON header (padded with spaces to 8 bytes), data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        data = tensors[name].contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_llama_logits(w, c, ids):
    """ids: [B, T] -> logits [B, T, V], HF LlamaForCausalLM semantics, float64."""
    B, Tn = ids.shape
    H, C = c["num_attention_heads"], c["hidden_size"]
    D = C // H
    Hkv = c.get("num_key_value_heads", H)
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(Tn, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((Tn, Tn), float("-inf"), dtype=torch.float64).triu(1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, Tn, H, D).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, Tn, Hkv, D).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, Tn, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # transformers' repeat_kv: query head j reads key/value head j // (H / Hkv).
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, Tn, C)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
    return x @ w["lm_head.weight"].T


def main():
    torch.manual_seed(5)
    c = CONFIG
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    w = {"model.embed_tokens.weight": torch.randn(V, C), "model.norm.weight": 1 + 0.1 * torch.randn(C),
         "lm_head.weight": torch.randn(V, C) / math.sqrt(C)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            w[p + f"self_attn.{n}.weight"] = torch.randn(C, C) / math.sqrt(C)
        w[p + "mlp.gate_proj.weight"] = torch.randn(F, C) / math.sqrt(C)
        w[p + "mlp.up_proj.weight"] = torch.randn(F, C) / math.sqrt(C)
        w[p + "mlp.down_proj.weight"] = torch.randn(C, F) / math.sqrt(F)
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
    os.makedirs(OUT, exist_ok=True)
    write_safetensors(os.path.join(OUT, "model.safetensors"), w)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(c, f, indent=2)

    # Token file: 5 complete windows of T+1 tokens (loom eval's windows: tokens [kT, kT+T]) and a spare.
    n = 5 * T + 1 + 3
    tokens = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(6))
    data_dir = os.path.join(HERE, "fixtures", "hf_data")
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "val.bin"), "wb") as f:
        f.write(struct.pack(f"<{n}H", *tokens.tolist()))
    with open(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump({"dtype": "uint16", "vocab_size": V}, f)

    w64 = {k: v.double() for k, v in w.items()}
    windows = (n - 1) // T
    ids = torch.stack([tokens[k * T : k * T + T] for k in range(windows)])
    targets = torch.stack([tokens[k * T + 1 : k * T + T + 1] for k in range(windows)])
    with torch.no_grad():
        logits = hf_llama_logits(w64, c, ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()
    ref = {"window": T, "windows": windows, "tokens": windows * T, "loss": loss,
           "ids_window0": ids[0].tolist(), "logits_window0": logits[0].flatten().tolist()}
    with open(os.path.join(HERE, "fixtures", "hf_reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"loss {loss:.9f} over {windows} windows of {T}")
    write_gqa_fixture(tokens, ids, targets)


def write_gqa_fixture(tokens, ids, targets):
    torch.manual_seed(7)
    c = dict(CONFIG, num_key_value_heads=2)
    C, F, V, H = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_attention_heads"]
    kv_rows = c["num_key_value_heads"] * (C // H)
    w = {"model.embed_tokens.weight": torch.randn(V, C), "model.norm.weight": 1 + 0.1 * torch.randn(C),
         "lm_head.weight": torch.randn(V, C) / math.sqrt(C)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = torch.randn(C, C) / math.sqrt(C)
        w[p + "self_attn.k_proj.weight"] = torch.randn(kv_rows, C) / math.sqrt(C)
        w[p + "self_attn.v_proj.weight"] = torch.randn(kv_rows, C) / math.sqrt(C)
        w[p + "self_attn.o_proj.weight"] = torch.randn(C, C) / math.sqrt(C)
        w[p + "mlp.gate_proj.weight"] = torch.randn(F, C) / math.sqrt(C)
        w[p + "mlp.up_proj.weight"] = torch.randn(F, C) / math.sqrt(C)
        w[p + "mlp.down_proj.weight"] = torch.randn(C, F) / math.sqrt(F)
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
    out = os.path.join(HERE, "fixtures", "hf_tiny_gqa")
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), w)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    w64 = {k: v.double() for k, v in w.items()}
    with torch.no_grad():
        logits = hf_llama_logits(w64, c, ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()
    ref = {"window": T, "windows": ids.shape[0], "loss": loss, "ids_window0": ids[0].tolist(),
           "logits_window0": logits[0].flatten().tolist()}
    with open(os.path.join(HERE, "fixtures", "hf_reference_gqa.json"), "w") as f:
        json.dump(ref, f)
    print(f"GQA: loss {loss:.9f} over {ids.shape[0]} windows of {T}")


if __name__ == "__main__":
    main()
