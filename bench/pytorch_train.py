#!/usr/bin/env python3
"""The PyTorch side of `loom bench train`: the same model (the CS336 Llama-style model, or GPT-2), the
same training step (forward, backward, global-norm clip, AdamW) on synthetic tokens, timed the same way.

    /usr/bin/python3 bench/pytorch_train.py --preset cs336-tinystories --batch 8 --steps 10 --threads 2
    /usr/bin/python3 bench/pytorch_train.py --preset gpt2-small --context 256 --batch 4 --steps 5
    $PEER_VENV/bin/python bench/pytorch_train.py --compile --bf16     # PyTorch 2.x (tools/peer_venv.sh)

Prints one JSON line with tokens_per_s, ms_per_step, params and flops_per_token (PaLM: 6N + 12*L*d*T,
N = the parameters in matrix multiplies: all but lookup tables, the head counted even when tied), so
the two lines compare directly. GPT-2 here is nanoGPT's: nn.Linear/nn.LayerNorm/F.gelu(tanh), tied head.

Attention is what a user would write on each version: F.scaled_dot_product_attention(is_causal=True) on
PyTorch 2.x (its fused CPU kernels), and the written-out softmax(QK^T)V on 1.13, which has no SDPA; the
JSON's "attention" field says which ran. --compile wraps the forward and the loss in torch.compile (the
default inductor backend, which generates and compiles C++ on the CPU: it needs a C++ compiler); the
backward it derives is compiled too, the clip and AdamW step stay eager, as in a typical user's loop.
Compilation happens in the warm-up steps and is reported apart ("compile_s"), not in the timed steps.

Memory, as `loom bench train` reports it (MiB, from /proc/self/status): "start_rss_mib" is the process
after `import torch` and before the model exists (PyTorch's import alone is a few hundred MiB: its
libraries, oneDNN, and with 2.x from PyPI the CUDA runtime's host side), "peak_rss_mib" the process's
peak (VmHWM) after the timed steps, warm-up and compilation included; peak - start is what the model and
its training step added. torch.compile compiles the generated C++ in worker processes, which are not in
this process's RSS; "children_peak_rss_mib" gives the largest of them (getrusage(RUSAGE_CHILDREN)).
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "cs336-tinystories": dict(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344, rope_theta=10000.0),
    "default": dict(vocab_size=2048, context_length=128, d_model=256, num_layers=4, num_heads=8, d_ff=704, rope_theta=10000.0),
    "tiny": dict(vocab_size=512, context_length=64, d_model=64, num_layers=2, num_heads=4, d_ff=192, rope_theta=10000.0),
    "gpt2-small": dict(arch="gpt2", vocab_size=50257, context_length=1024, d_model=768, num_layers=12, num_heads=12,
                       d_ff=3072, qkv_bias=True, tie_embeddings=True),
}


class Gpt2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["d_ff"]
        self.h = c["num_heads"]
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=c["qkv_bias"])
        self.c_proj = nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        D = C // self.h
        q, k, v = (t.view(B, T, self.h, D).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        a = causal_attention(q, k, v, mask)
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, c, T):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c["vocab_size"], c["d_model"]), nn.Embedding(c["context_length"], c["d_model"])
        self.h = nn.ModuleList(Gpt2Block(c) for _ in range(c["num_layers"]))
        self.ln_f = nn.LayerNorm(c["d_model"])
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))
        for name, p in self.named_parameters():  # GPT-2's init (as loom's): N(0, 0.02), biases 0
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02 / (math.sqrt(2 * c["num_layers"]) if name.endswith("proj.weight") else 1))
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x, self.mask[:T, :T])
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def causal_attention(q, k, v, mask):
    """q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def rope(x, cos, sin):
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack((xe * cos - xo * sin, xe * sin + xo * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["d_ff"]
        self.h = c["num_heads"]
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.ln1, self.ln2 = RMSNorm(d), RMSNorm(d)
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        D = C // self.h
        h = self.ln1(x)
        q, k, v = (p(h).view(B, T, self.h, D).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = causal_attention(q, k, v, mask)
        x = x + self.output_proj(a.transpose(1, 2).reshape(B, T, C))
        h = self.ln2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TransformerLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.token_embeddings = nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_layers"]))
        self.ln_final = RMSNorm(c["d_model"])
        self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)
        T, D = c["context_length"], c["d_model"] // c["num_heads"]
        inv = c["rope_theta"] ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float())
        self.register_buffer("sin", ang.sin().float())
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, ids):
        T = ids.shape[1]
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T], self.mask[:T, :T])
        return self.lm_head(self.ln_final(x))


def proc_status_mib(key):
    """VmRSS (resident now) or VmHWM (peak since exec) of this process, in MiB; -1 without procfs."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return -1.0


def memory_fields(start_rss_mib):
    """The JSON's memory fields, read after the timed steps (loom's names and meanings)."""
    return {"start_rss_mib": start_rss_mib, "peak_rss_mib": proc_status_mib("VmHWM"),
            "children_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def main():
    start_rss_mib = proc_status_mib("VmRSS")
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cs336-tinystories", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=0, help="sequence length (default: the preset's context)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) around forward and loss")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward and loss (PyTorch >= 2.0)")
    args = ap.parse_args()
    if args.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile needs PyTorch >= 2.0; this is {torch.__version__} (tools/peer_venv.sh installs one)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = dict(PRESETS[args.preset])
    T = args.context or c["context_length"]
    gpt2 = c.get("arch") == "gpt2"
    if not gpt2:
        c["context_length"] = T
    model = Gpt2(c, T) if gpt2 else TransformerLM(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    B, V = args.batch, c["vocab_size"]
    stream = torch.randint(0, V, (B, T + 1))
    x, y = stream[:, :-1].contiguous(), stream[:, 1:].contiguous()

    def forward_loss(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            return F.cross_entropy(model(x).view(-1, V).float(), y.view(-1))

    loss_fn = torch.compile(forward_loss) if args.compile else forward_loss

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    warm_start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    warm_seconds = time.perf_counter() - warm_start
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    n = params - V * c["d_model"]  # the Llama's token table; GPT-2: minus wte and wpe, plus the tied head
    if gpt2:
        n = params - c["context_length"] * c["d_model"]
    fpt = 6 * n + 12 * c["num_layers"] * c["d_model"] * T
    tps = B * T * args.steps / seconds
    print(json.dumps({"framework": f"pytorch {torch.__version__}", "tokens_per_s": tps,
                      "ms_per_step": seconds * 1e3 / args.steps, "params": params, "flops_per_token": fpt,
                      "gflops": tps * fpt / 1e9, "threads": args.threads, "precision": "bf16" if args.bf16 else "f32", "final_loss": loss,
                      "compiled": args.compile, "compile_s": warm_seconds if args.compile else 0.0,
                      "attention": "sdpa" if HAS_SDPA else "explicit", **memory_fields(start_rss_mib)}))


if __name__ == "__main__":
    main()
