#!/usr/bin/env python3
"""Writes Hugging Face GPT-2 directories for loom's importer tests, written by transformers itself (not by
loom), and the logits and loss transformers computes from them.

Run with the transformers venv (transformers 4.35, safetensors, Debian's torch 1.13):
    /tmp/hfvenv/bin/python tests/models/gpt2/make_hf_gpt2_fixture.py

Writes, under tests/models/gpt2/fixtures/:
  hf_gpt2_tiny/     GPT2LMHeadModel(GPT2Config(...)).save_pretrained(dir, safe_serialization=True): tied
                    embeddings (no lm_head.weight in the file), n_embd 32, n_head 4, n_layer 2,
                    n_positions 32, vocab 300, float32.
  hf_gpt2_untied/   another shape: n_embd 48, n_head 3, n_layer 3, n_inner 80 (set explicitly),
                    n_positions 24, vocab 311, tie_word_embeddings false (lm_head.weight stored).
  hf_gpt2_fp16/     the tiny shape, model.half().save_pretrained: F16 tensors, torch_dtype float16.
  hf_gpt2_sharded/  the tiny shape, save_pretrained(max_shard_size="20KB"): model-0000k-of-0000N.safetensors
                    shards and model.safetensors.index.json.
  hf_gpt2_openai/   the tiny shape stored as OpenAI's openai-community/gpt2 repository stores it: names
                    without the "transformer." prefix (wte.weight, h.0.attn.c_attn.weight, ...), the
                    h.N.attn.bias ([1, 1, n_positions, n_positions] lower-triangular ones, F32) and
                    h.N.attn.masked_bias (F32 scalar -1e4, shape []) buffers, no lm_head.weight; written
                    with the safetensors library from a transformers model's state dict, and a config.json
                    in that repository's style (n_ctx, no n_inner, no tie_word_embeddings, dropouts 0.1).
  hf_gpt2_data/     val.bin (uint16 tokens < 300) and meta.json: 5 evaluation windows of 16 (+1) tokens.
  hf_gpt2_reference.json
                    one entry per directory, each in the format of hf_reference.json (the Llama fixture):
                    {"window": 16, "windows": 5, "tokens": 80, "loss": mean cross-entropy over the
                    windows of val.bin, "ids_window0": [16 ids], "logits_window0": [16 * vocab floats,
                    row-major [T, V]]}, from transformers' GPT2LMHeadModel loaded back from the saved
                    directory, model.eval(), float32 (for hf_gpt2_fp16: the F16 weights widened to F32).

Weights are seeded; every LayerNorm gain and bias, every Linear bias and every matrix is redrawn away from
transformers' init (gains 1 + 0.1 N(0,1), biases 0.1 N(0,1), Conv1D weights N(0,1)/sqrt(fan_in),
embeddings 0.3 N(0,1)) so that a transposed Conv1D weight, a wrong q/k/v split or a dropped bias shows.
HF GPT-2 uses Conv1D: weights are stored [in, out], and c_attn packs q, k, v along out.

As a check, each directory's safetensors files are also read with the safetensors library alone, mapped to
loom's names by hand and run through the independent float64 GPT-2 of
tests/models/gpt2/fixtures/make_gpt2_fixtures.py; the largest difference from transformers' logits is printed.
Nothing here uses loom's code.
"""
import glob
import json
import math
import os
import shutil
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
sys.path.insert(0, FIXTURES)
from make_gpt2_fixtures import f32_text, forward as oracle_forward  # noqa: E402

T, WINDOWS, DATA_VOCAB = 16, 5, 300
TINY = dict(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4)
UNTIED = dict(vocab_size=311, n_positions=24, n_embd=48, n_layer=3, n_head=3, n_inner=80, tie_word_embeddings=False)


def make_model(kwargs, seed):
    torch.manual_seed(seed)
    # bos/eos: the last id (GPT2Config's default 50256 is outside these small vocabularies).
    last = kwargs["vocab_size"] - 1
    model = GPT2LMHeadModel(GPT2Config(bos_token_id=last, eos_token_id=last, **kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(0.3 * torch.randn(p.shape))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape))
            elif p.dim() == 1:  # LayerNorm gains
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            elif name == "lm_head.weight":  # only listed when untied; [V, C] nn.Linear
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[1]))
            else:  # Conv1D [in, out]
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[0]))
    return model.eval()


def read_dir_tensors(d):
    """Every tensor of every *.safetensors file in d, by the safetensors library alone."""
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(load_file(path))
    return out


def oracle_params(d):
    """The directory's tensors under loom's names, float64, from HF's Conv1D layout."""
    with open(os.path.join(d, "config.json")) as f:
        hc = json.load(f)
    raw = {k[len("transformer."):] if k.startswith("transformer.") else k: v.to(torch.float64)
           for k, v in read_dir_tensors(d).items()}
    C, L = hc["n_embd"], hc["n_layer"]
    c = dict(vocab_size=hc["vocab_size"], context_length=hc["n_positions"], d_model=C, num_layers=L,
             num_heads=hc["n_head"], d_ff=hc.get("n_inner") or 4 * C, norm_eps=hc.get("layer_norm_epsilon", 1e-5),
             qkv_bias=True, output_proj_bias=True, tie_embeddings=hc.get("tie_word_embeddings", True), dropout=0.0)
    P = {"token_embeddings.weight": raw["wte.weight"], "position_embeddings.weight": raw["wpe.weight"],
         "ln_final.weight": raw["ln_f.weight"], "ln_final.bias": raw["ln_f.bias"]}
    if not c["tie_embeddings"]:
        P["lm_head.weight"] = raw["lm_head.weight"]
    else:
        assert "lm_head.weight" not in raw
    for i in range(L):
        p, h = f"layers.{i}.", f"h.{i}."
        P[p + "ln1.weight"], P[p + "ln1.bias"] = raw[h + "ln_1.weight"], raw[h + "ln_1.bias"]
        P[p + "ln2.weight"], P[p + "ln2.bias"] = raw[h + "ln_2.weight"], raw[h + "ln_2.bias"]
        w, b = raw[h + "attn.c_attn.weight"], raw[h + "attn.c_attn.bias"]
        for j, n in enumerate("qkv"):
            P[p + f"attn.{n}_proj.weight"] = w[:, j * C:(j + 1) * C].T
            P[p + f"attn.{n}_proj.bias"] = b[j * C:(j + 1) * C]
        P[p + "attn.output_proj.weight"] = raw[h + "attn.c_proj.weight"].T
        P[p + "attn.output_proj.bias"] = raw[h + "attn.c_proj.bias"]
        P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"] = raw[h + "mlp.c_fc.weight"].T, raw[h + "mlp.c_fc.bias"]
        P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"] = raw[h + "mlp.c_proj.weight"].T, raw[h + "mlp.c_proj.bias"]
    return P, c


def write_openai_layout(model, d):
    """OpenAI's openai-community/gpt2 layout: GPT2Model names (no "transformer."), attn.bias / masked_bias."""
    c = model.config
    n = c.n_positions
    tensors = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied to wte: the OpenAI file has no head
        assert k.startswith("transformer."), k
        tensors[k[len("transformer."):]] = v.detach().clone().contiguous()
    for i in range(c.n_layer):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.float32)).view(1, 1, n, n)
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4, dtype=torch.float32)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": c.vocab_size - 1,
        "embd_pdrop": 0.1,
        "eos_token_id": c.vocab_size - 1,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": n,
        "n_embd": c.n_embd,
        "n_head": c.n_head,
        "n_layer": c.n_layer,
        "n_positions": n,
        "resid_pdrop": 0.1,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": c.vocab_size,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def reference(d, ids, targets, fp16=False):
    """transformers' float32 logits and loss, from the directory as saved."""
    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True, torch_dtype=torch.float16 if fp16 else None)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"], info
    unexpected = [k for k in info["unexpected_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    assert not unexpected, unexpected
    if fp16:
        assert model.transformer.wte.weight.dtype == torch.float16
    model = model.float().eval()
    with torch.no_grad():
        logits = model(ids).logits
    V = model.config.vocab_size
    loss = F.cross_entropy(logits.double().reshape(-1, V), targets.reshape(-1)).item()
    ref = {"window": T, "windows": int(ids.shape[0]), "tokens": int(ids.numel()), "loss": loss,
           "ids_window0": ids[0].tolist(), "logits_window0": [f32_text(v) for v in logits[0].flatten().tolist()]}
    # The independent float64 GPT-2 on the same files.
    P, c = oracle_params(d)
    with torch.no_grad():
        oracle = oracle_forward(P, ids, c)
    diff = (oracle - logits.double()).abs().max().item()
    oracle_loss = F.cross_entropy(oracle.reshape(-1, V), targets.reshape(-1)).item()
    return ref, model, diff, abs(oracle_loss - loss)


def main():
    n = WINDOWS * T + 1 + 3
    tokens = torch.randint(0, DATA_VOCAB, (n,), generator=torch.Generator().manual_seed(6))
    data_dir = os.path.join(FIXTURES, "hf_gpt2_data")
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "val.bin"), "wb") as f:
        f.write(struct.pack(f"<{n}H", *tokens.tolist()))
    with open(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump({"dtype": "uint16", "vocab_size": DATA_VOCAB}, f)
    ids = torch.stack([tokens[k * T: k * T + T] for k in range(WINDOWS)])
    targets = torch.stack([tokens[k * T + 1: k * T + T + 1] for k in range(WINDOWS)])

    def fresh(name):
        d = os.path.join(FIXTURES, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    refs = {}
    report = []

    def record(name, d, fp16=False):
        ref, model, diff, dloss = reference(d, ids, targets, fp16)
        refs[name] = ref
        files = sorted(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        report.append(f"{name}: loss {ref['loss']:.6f}; float64 oracle vs transformers: max |dlogits| {diff:.2e}, "
                      f"|dloss| {dloss:.2e}; {size} bytes in {files}")
        return model

    d = fresh("hf_gpt2_tiny")
    make_model(TINY, 10).save_pretrained(d, safe_serialization=True)
    record("hf_gpt2_tiny", d)

    d = fresh("hf_gpt2_untied")
    make_model(UNTIED, 11).save_pretrained(d, safe_serialization=True)
    record("hf_gpt2_untied", d)

    d = fresh("hf_gpt2_fp16")
    make_model(TINY, 12).half().save_pretrained(d, safe_serialization=True)
    record("hf_gpt2_fp16", d, fp16=True)

    d = fresh("hf_gpt2_sharded")
    make_model(TINY, 13).save_pretrained(d, safe_serialization=True, max_shard_size="20KB")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    record("hf_gpt2_sharded", d)

    d = fresh("hf_gpt2_openai")
    source = make_model(TINY, 14)
    write_openai_layout(source, d)
    loaded = record("hf_gpt2_openai", d)
    with torch.no_grad():
        same = (loaded(ids).logits - source(ids).logits).abs().max().item()
    assert same == 0.0, same  # transformers reads the OpenAI layout back to the very same model
    report.append("hf_gpt2_openai: transformers loads it back to the source model exactly (logits equal)")

    with open(os.path.join(FIXTURES, "hf_gpt2_reference.json"), "w") as f:
        json.dump(refs, f)
    print("\n".join(report))


if __name__ == "__main__":
    main()
