#!/usr/bin/env python3
"""Checks bench/pytorch_dsv3.py against the seed's own JAX code on the same weights (dsv3-tiny, f32), so
that the PyTorch side of the speed comparison is the seed's model: logits, the balance loss, the expert
loads, the MTP loss and every gradient.

    /tmp/jaxvenv/bin/python bench/check_pytorch_dsv3.py --dump /tmp/seed.npz   # the seed's side (JAX)
    /usr/bin/python3 bench/check_pytorch_dsv3.py --check /tmp/seed.npz         # the PyTorch side

The seed's loss_fn takes T + 1 + n_mtp tokens and scores T positions per module; pytorch_dsv3 takes T + 1
(loom's batches). Fed the seed's T + 2 tokens as ids = tokens[:T+1], targets = tokens[1:T+2], the
PyTorch MTP module scores exactly the seed's T positions (causal: the trunk's first T states are the
seed's), while its main loss covers one position more; so the main loss, logits, loads and balance loss
are compared on a separate forward of the seed's T tokens, and the gradients of main + lambda*mtp + seq
on the seed's objective rebuilt from those two passes.
"""
import argparse
import re
import sys

import numpy as np

TINY = "dsv3-tiny"  # a loom preset, resolved by `loom config` (bench/loom_config.py)


def dump(path):
    sys.argv = [sys.argv[0], "--threads", "2"]
    sys.path.insert(0, "bench")
    import jax
    import jax_dsv3_seed as s
    cfg = s.config_from_loom(TINY, 2, "float32")
    params = s.init_params(cfg, jax.random.PRNGKey(3))
    biases = jax.random.normal(jax.random.PRNGKey(4), (cfg.n_layers - cfg.n_dense, cfg.n_routed)) * 0.01
    tok = jax.random.randint(jax.random.PRNGKey(5), (2, cfg.seq_len + 2), 0, cfg.vocab)
    (loss, m), grads = jax.value_and_grad(lambda p: s.loss_fn(p, biases, tok, cfg), has_aux=True)(params)
    logits, _, aux, _ = s.forward(params, biases, tok[:, :cfg.seq_len], cfg)
    flat = {}
    for prefix, tree in (("p", params), ("g", grads)):
        for where, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            flat[prefix + ":" + ".".join(re.findall(r"\[['\"]?([^'\"\]]+)['\"]?\]", jax.tree_util.keystr(where)))] = np.asarray(leaf)
    np.savez(path, tok=np.asarray(tok), biases=np.asarray(biases), logits=np.asarray(logits), loss=np.asarray(loss),
             seq=np.asarray(aux["seq_loss"]), load=np.asarray(aux["load"]), mtp=np.asarray(m["mtp"]),
             main=np.asarray(m["main"]), **flat)
    print(f"seed: loss {float(loss):.6f} main {float(m['main']):.6f} mtp {float(m['mtp']):.6f} -> {path}")


def torch_name(seed_name, shape):
    """The seed's parameter path -> (pytorch_dsv3 name, how to turn the seed's array into it)."""
    n = seed_name.replace("moe.experts.", "moe.")
    if re.search(r"moe\.w[123]$", n):
        return n, lambda a: a.transpose(0, 2, 1)          # [E, in, out] -> [E, out, in]
    if n.endswith("moe.router"):
        return n, lambda a: a.T
    if n == "embed":
        return "embed.weight", lambda a: a
    return n + ".weight", (lambda a: a.T) if len(shape) == 2 else (lambda a: a)


def check(path):
    import torch
    sys.path.insert(0, "bench")
    import pytorch_dsv3 as pt
    torch.set_num_threads(2)
    z = np.load(path)
    c = pt.load_model_config(TINY)
    model = pt.DeepSeekV3({**c, "context_length": c["context_length"] + 1})  # room for the MTP pass's T + 1
    named = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for key in z.files:
            if not key.startswith("p:"):
                continue
            name, conv = torch_name(key[2:], z[key].shape)
            named[name].copy_(torch.from_numpy(np.ascontiguousarray(conv(z[key]))))
            seen.add(name)
        moes = [layer.moe for layer in model.layers if layer.moe is not None]
        for moe, b in zip(moes, z["biases"]):
            moe.bias.copy_(torch.from_numpy(b))
    missing = set(named) - seen
    assert not missing, f"parameters the seed does not have: {sorted(missing)}"
    tok = torch.from_numpy(z["tok"]).long()
    T = tok.shape[1] - 2
    worst = {}

    def close(what, got, want, tol):
        err = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want)) / max(1e-30, float(np.max(np.abs(want)))))
        worst[what] = err
        assert err < tol, f"{what}: relative error {err:.3g} >= {tol}"

    # The seed's T tokens: logits, loads, balance loss, main loss.
    _, main, _, seq, loads = model.loss(tok[:, :T], tok[:, 1:T + 1])
    x = model.embed(tok[:, :T])
    for layer in model.layers:
        x, _, _ = layer(x, model.cos[:T], model.sin[:T], model.mask[:T, :T])
    close("logits", model.head(model.norm_f(x)).detach(), z["logits"], 1e-5)
    close("load", torch.stack(loads), z["load"], 1e-7)
    close("seq", seq.detach(), z["seq"], 1e-5)
    close("main", main.detach(), z["main"], 1e-6)
    # The seed's MTP positions: T + 1 ids, the module scoring T of them.
    _, _, mtp, _, _ = model.loss(tok[:, :T + 1], tok[:, 1:T + 2])
    close("mtp", mtp.detach(), z["mtp"], 1e-6)
    # Gradients of the seed's objective: main, seq from the first pass, mtp from the second.
    model.zero_grad()
    (main + seq + c["mtp_lambda"] * mtp).backward()
    for key in z.files:
        if key.startswith("g:"):
            name, conv = torch_name(key[2:], z[key].shape)
            close("grad " + name, named[name].grad, conv(z[key]), 1e-4)
    print(f"pytorch_dsv3 == seed (JAX) on dsv3-tiny, f32: {len(worst)} comparisons; worst relative error "
          f"{max(worst.values()):.2e} ({max(worst, key=worst.get)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump")
    ap.add_argument("--check")
    a = ap.parse_args()
    if bool(a.dump) == bool(a.check):
        sys.exit("give exactly one of --dump FILE (with jax) or --check FILE (with torch)")
    dump(a.dump) if a.dump else check(a.check)


if __name__ == "__main__":
    main()
