#!/usr/bin/env python3
"""The PyTorch side of `loom bench train --preset dsv3-mini`: the seed's DeepSeek-V3 (shared/seeds/002)
written as ordinary PyTorch, the same training step (forward, backward, global-norm clip, AdamW, then the
aux-loss-free bias update) on synthetic tokens, timed the same way.

    /usr/bin/python3 bench/pytorch_dsv3.py --config dsv3-mini --batch 8 --steps 3 --threads 2
    /usr/bin/python3 bench/pytorch_dsv3.py --config dsv3-mini --count   # parameters only
    $PEER_VENV/bin/python bench/pytorch_dsv3.py --compile [--bf16]      # PyTorch 2.x (tools/peer_venv.sh)

The model is a loom preset's or config file's "model" section (arch deepseek_v3), resolved by `loom config`
(bench/loom_config.py; build loom first). It is an independent
restatement of the seed, not of loom:
  * MLA: q = wq_b(rms(wq_a x)) split per head into nope | rope; [c | k_rope] = wkv_a x, c RMSNorm'd,
    k_rope one RoPE key shared by the heads; wkv_b c -> per-head k_nope | v; scale 1/sqrt(nope + rope);
    RoPE in the seed's rotate-half layout;
  * MoE: shared SwiGLU expert(s) plus routed SwiGLU experts; sigmoid affinities in f32, top-k on
    affinity + bias (the bias picks, the gates use the raw affinities, normalised, times route_scale);
    the routed experts run the way PyTorch MoE code usually does, a Python loop over experts gathering
    each expert's tokens with index_select and scattering back with index_add_;
  * the seed's sequence-wise balance loss and multi-token prediction (shared embedding and head).
MTP follows loom's batches of T + 1 tokens: module k scores the T - k positions it can (the seed feeds
T + 1 + n_mtp tokens and scores T); the step's work differs by one position in 256.

--compile wraps the model's loss (forward, routing, balance loss and MTP) in torch.compile, as a user of
PyTorch 2.x would; the expert loop's per-expert token counts are data (`counts.tolist()`), so TorchDynamo
splits the graph there and compiles the pieces, recompiling for new per-expert row counts until it marks
them dynamic. The warm-up steps (default 2 with --compile) absorb that; "compile_s" is their time.

Prints one JSON line: tokens_per_s and ms_per_step (total wall time / steps, as `loom bench train`),
median_ms_per_step (per-step wall times), cpu_ms_per_step (process CPU time per step: less sensitive
to other jobs on a shared machine), params, params_per_token (the seed's "used per token": all minus
the embedding table and the MTP modules, with top_k of the routed experts), final_loss, and the memory
fields of bench/pytorch_train.py (start_rss_mib, peak_rss_mib, children_peak_rss_mib).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import loom_config
from pytorch_train import memory_fields, proc_status_mib

MODEL_KEYS = ("vocab_size", "context_length", "d_model", "num_layers", "n_dense", "num_heads", "q_rank", "kv_rank",
              "d_nope", "d_rope", "d_v", "d_ff", "n_shared", "n_routed", "top_k", "d_expert", "route_scale", "gamma",
              "alpha_seq", "n_mtp", "mtp_lambda", "rope_theta", "init_std", "norm_eps")


def load_model_config(config):
    """The model section of a loom preset name or config file, resolved in full by loom."""
    m = loom_config.resolve(config)["model"]
    if m.get("arch") != "deepseek_v3":
        sys.exit(f"{config}: model.arch is {m.get('arch')!r}, this script builds deepseek_v3 only")
    missing = [k for k in MODEL_KEYS if k not in m]
    if missing:
        sys.exit(f"{config}: model is missing {', '.join(missing)}")
    return {k: m[k] for k in MODEL_KEYS}


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half_rope(x, cos, sin):
    # x [..., T, H?, P] with cos/sin [T, P/2] broadcast over the head axis: pairs (x[i], x[i + P/2]).
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def linear(c, n_in, n_out):
    lin = nn.Linear(n_in, n_out, bias=False)
    nn.init.normal_(lin.weight, std=c["init_std"])
    return lin


class SwiGLU(nn.Module):
    def __init__(self, c, hidden):
        super().__init__()
        self.w1, self.w3 = linear(c, c["d_model"], hidden), linear(c, c["d_model"], hidden)
        self.w2 = linear(c, hidden, c["d_model"])

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H = c["d_model"], c["num_heads"]
        self.H, self.dn, self.dr, self.dv, self.R = H, c["d_nope"], c["d_rope"], c["d_v"], c["kv_rank"]
        self.wq_a, self.q_norm = linear(c, d, c["q_rank"]), RMSNorm(c["q_rank"], c["norm_eps"])
        self.wq_b = linear(c, c["q_rank"], H * (self.dn + self.dr))
        self.wkv_a, self.kv_norm = linear(c, d, self.R + self.dr), RMSNorm(self.R, c["norm_eps"])
        self.wkv_b = linear(c, self.R, H * (self.dn + self.dv))
        self.wo = linear(c, H * self.dv, d)
        self.scale = 1.0 / math.sqrt(self.dn + self.dr)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, dn + dr)
        q_nope, q_rope = q.split([dn, dr], dim=-1)
        q_rope = rotate_half_rope(q_rope, cos[:, None], sin[:, None])           # [B,T,H,dr]
        c_kr = self.wkv_a(x)                                                     # [B,T,R+dr]
        lat, kr = c_kr.split([self.R, dr], dim=-1)
        kv = self.wkv_b(self.kv_norm(lat)).view(B, T, H, dn + dv)
        k_nope, v = kv.split([dn, dv], dim=-1)
        kr = rotate_half_rope(kr, cos, sin)[:, :, None].expand(B, T, H, dr)      # one key for all heads
        qh = torch.cat((q_nope, q_rope), -1).transpose(1, 2)                     # [B,H,T,dn+dr]
        kh = torch.cat((k_nope, kr), -1).transpose(1, 2)
        s = (qh @ kh.transpose(-1, -2)) * self.scale                             # [B,H,T,T]
        a = torch.softmax(s.float().masked_fill(~mask, float("-inf")), dim=-1).to(v.dtype)
        out = (a @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, H * dv)
        return self.wo(out)


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, E, h = c["d_model"], c["n_routed"], c["d_expert"]
        self.E, self.K, self.route_scale, self.alpha = E, c["top_k"], c["route_scale"], c["alpha_seq"]
        self.router = nn.Parameter(torch.randn(E, d) * c["init_std"])
        self.shared = SwiGLU(c, c["n_shared"] * h) if c["n_shared"] > 0 else None
        self.w1 = nn.Parameter(torch.randn(E, h, d) * c["init_std"])   # [E, hidden, d] like nn.Linear weights
        self.w3 = nn.Parameter(torch.randn(E, h, d) * c["init_std"])
        self.w2 = nn.Parameter(torch.randn(E, d, h) * c["init_std"])
        self.register_buffer("bias", torch.zeros(E))

    def forward(self, x):
        B, T, d = x.shape
        xf = x.reshape(B * T, d)
        with torch.autocast("cpu", enabled=False):                               # the seed routes in f32
            scores = torch.sigmoid(xf.float() @ self.router.t())                 # [N,E]
        idx = torch.topk(scores + self.bias, self.K, dim=-1).indices             # [N,K]: bias picks...
        g = scores.gather(1, idx)                                                # ...gates use raw scores
        g = g / g.sum(-1, keepdim=True) * self.route_scale
        out = self.shared(xf) if self.shared is not None else torch.zeros_like(xf)
        flat = idx.reshape(-1)                                                   # [N*K]
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        rows_sorted = order // self.K
        gates_sorted = g.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts.tolist()):                                  # the usual expert loop
            if n == 0:
                continue
            rows = rows_sorted[start:start + n]
            xe = xf.index_select(0, rows)                                        # [n, d]
            ye = F.linear(F.silu(F.linear(xe, self.w1[e])) * F.linear(xe, self.w3[e]), self.w2[e])
            ye = ye * gates_sorted[start:start + n, None].to(ye.dtype)
            out = out.index_add(0, rows, ye.to(out.dtype))
            start += n
        picked = torch.zeros_like(scores).scatter_(1, idx, 1.0).view(B, T, self.E)
        f = picked.sum(1) * self.E / (self.K * T)                                # [B,E], 1 = even
        P = (scores / scores.sum(-1, keepdim=True)).view(B, T, self.E).mean(1)   # [B,E]
        seq_loss = self.alpha * (f * P).sum(-1).mean()
        load = counts.float() / (B * T * self.K)                                 # share of routed slots
        return out.view(B, T, d), seq_loss, load


class Block(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.norm_attn, self.norm_ffn = RMSNorm(c["d_model"], c["norm_eps"]), RMSNorm(c["d_model"], c["norm_eps"])
        self.attn = MLA(c)
        self.moe = MoE(c) if moe else None
        self.ffn = None if moe else SwiGLU(c, c["d_ff"])

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.norm_attn(x), cos, sin, mask)
        h = self.norm_ffn(x)
        if self.moe is None:
            return x + self.ffn(h), None, None
        f, seq_loss, load = self.moe(h)
        return x + f, seq_loss, load


class Mtp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.norm_h, self.norm_e = RMSNorm(d, c["norm_eps"]), RMSNorm(d, c["norm_eps"])
        self.proj = linear(c, 2 * d, d)
        self.block = Block(c, moe=False)


class DeepSeekV3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab_size"], c["d_model"])
        nn.init.normal_(self.embed.weight, std=c["init_std"])
        self.layers = nn.ModuleList(Block(c, moe=i >= c["n_dense"]) for i in range(c["num_layers"]))
        self.mtp = nn.ModuleList(Mtp(c) for _ in range(c["n_mtp"]))
        self.norm_f = RMSNorm(c["d_model"], c["norm_eps"])
        self.head = linear(c, c["d_model"], c["vocab_size"])
        T, P = c["context_length"], c["d_rope"]
        inv = c["rope_theta"] ** (-torch.arange(0, P, 2, dtype=torch.float64) / P)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float())
        self.register_buffer("sin", ang.sin().float())
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def ce(self, h, targets):
        logits = self.head(self.norm_f(h)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def loss(self, ids, targets):
        """ids, targets [B, T] (targets[t] = the token after ids[t]): (total, main, mtp, seq, loads)."""
        c, T = self.c, ids.shape[1]
        x = self.embed(ids)
        seq, loads = 0.0, []
        for layer in self.layers:
            x, s, load = layer(x, self.cos[:T], self.sin[:T], self.mask[:T, :T])
            if s is not None:
                seq, loads = seq + s, loads + [load]
        main = self.ce(x, targets)
        h, mtp = x, 0.0
        for k, m in enumerate(self.mtp, start=1):
            n = T - k
            e = self.embed(ids[:, k:])                                           # shared embedding
            h = m.proj(torch.cat((m.norm_h(h[:, :n]), m.norm_e(e)), -1))
            h, _, _ = m.block(h, self.cos[:n], self.sin[:n], self.mask[:n, :n])
            mtp = mtp + self.ce(h, targets[:, k:])                               # shared head
        mtp = mtp / max(1, c["n_mtp"])
        return main + c["mtp_lambda"] * mtp + seq, main, mtp, seq, loads

    def params_per_token(self):
        c = self.c
        total = sum(p.numel() for p in self.parameters())
        per_expert = 3 * c["d_model"] * c["d_expert"]
        idle = sum(1 for layer in self.layers if layer.moe is not None) * (c["n_routed"] - c["top_k"]) * per_expert
        return total - self.embed.weight.numel() - sum(p.numel() for p in self.mtp.parameters()) - idle


def main():
    start_rss_mib = proc_status_mib("VmRSS")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="dsv3-mini", help="loom preset name or config file")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=-1, help="untimed steps first (default 1; 2 with --compile)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) around the forward and loss")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model's loss (PyTorch >= 2.0)")
    ap.add_argument("--count", action="store_true", help="print the parameter counts and exit")
    args = ap.parse_args()
    if args.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile needs PyTorch >= 2.0; this is {torch.__version__} (tools/peer_venv.sh installs one)")
    if args.warmup < 0:
        args.warmup = 2 if args.compile else 1
    for name in ("batch", "steps", "threads"):
        if getattr(args, name) <= 0:
            sys.exit(f"--{name} must be positive, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = load_model_config(args.config)
    model = DeepSeekV3(c)
    params = sum(p.numel() for p in model.parameters())
    if args.count:
        print(json.dumps({"params": params, "params_per_token": model.params_per_token()}))
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    B, T, V = args.batch, c["context_length"], c["vocab_size"]
    stream = torch.randint(0, V, (B, T + 1))
    ids, targets = stream[:, :-1].contiguous(), stream[:, 1:].contiguous()
    moes = [layer.moe for layer in model.layers if layer.moe is not None]
    loss_fn = torch.compile(model.loss) if args.compile else model.loss

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss, _, _, _, loads = loss_fn(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():                                                    # aux-loss-free balancing
            for moe, load in zip(moes, loads):
                moe.bias += c["gamma"] * torch.sign(load.mean() - load)
        return loss.item()

    warm_start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    warm_seconds = time.perf_counter() - warm_start
    walls, cpus = [], []
    for _ in range(args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    seconds = sum(walls)
    print(json.dumps({"framework": f"pytorch {torch.__version__}", "tokens_per_s": B * T * args.steps / seconds,
                      "ms_per_step": seconds * 1e3 / args.steps, "median_ms_per_step": statistics.median(walls) * 1e3,
                      "cpu_ms_per_step": sum(cpus) * 1e3 / args.steps, "params": params,
                      "params_per_token": model.params_per_token(), "batch": B, "seq": T, "threads": args.threads,
                      "precision": "bf16" if args.bf16 else "f32", "final_loss": loss, "compiled": args.compile,
                      "compile_s": warm_seconds if args.compile else 0.0, **memory_fields(start_rss_mib)}))


if __name__ == "__main__":
    main()
