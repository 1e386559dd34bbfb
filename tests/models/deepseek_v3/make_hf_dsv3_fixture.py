#!/usr/bin/env python3
"""Writes Hugging Face DeepSeek-V3 directories for loom's importer tests, written by transformers itself (not by
loom), and the logits and loss transformers computes from them.

Needs a transformers with DeepseekV3 (4.50+, which needs torch 2), e.g.
    python3 -m venv /tmp/dsv3venv && /tmp/dsv3venv/bin/pip install torch transformers safetensors
    /tmp/dsv3venv/bin/python tests/models/deepseek_v3/make_hf_dsv3_fixture.py

Writes, under tests/models/deepseek_v3/fixtures/:
  hf_dsv3_tiny/         DeepseekV3ForCausalLM(DeepseekV3Config(...)).save_pretrained(dir): vocab 96, hidden 32,
                        3 layers (first_k_dense_replace 1, so 2 MoE layers), 2 heads, q_lora_rank 16,
                        kv_lora_rank 8, qk_nope_head_dim 8, qk_rope_head_dim 4, v_head_dim 6, intermediate 40,
                        1 shared + 6 routed experts of 12, top 2, routed_scaling_factor 2.5, n_group 1,
                        rope_theta 500, rms_norm_eps 1e-6 (see below), rope_interleave true (transformers' default),
                        num_nextn_predict_layers 1 (transformers does not write the MTP layer), untied head.
  hf_dsv3_rotate_half/  the same weights with rope_interleave false.
  hf_dsv3_reference.json
                        per directory: {"ids": [T ids], "logits": [T * vocab floats, row-major [T, V]],
                        "loss": mean next-token cross-entropy of ids[1:] given ids[:-1] over the T - 1
                        positions}, from the model loaded back from the directory, eval(), float32.

Every weight is redrawn away from transformers' init (matrices N(0,1)/sqrt(fan_in), norm gains 1 + 0.1 N(0,1),
embeddings 0.5 N(0,1)) and e_score_correction_bias is N(0, 0.1), so that a wrong RoPE row order, a dropped
bias or a swapped expert shows. The script prints the smallest gap between each token's k-th and (k+1)-th
routing choice, so that a test input does not sit on a tie.

rms_norm_eps is 1e-6 because transformers' q_a_layernorm and kv_a_layernorm always use eps 1e-6 (as DeepSeek's
own code), whatever rms_norm_eps says, while loom's MLA norms use model.norm_eps like every other norm.
"""
import json
import os
import shutil

import torch
import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
T = 12

CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=3,
              num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=6,
              routed_scaling_factor=2.5, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=4, v_head_dim=6,
              qk_nope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
              norm_topk_prob=True, max_position_embeddings=32, rope_theta=500.0, rms_norm_eps=1e-6,
              tie_word_embeddings=False, num_nextn_predict_layers=1, attention_bias=False)


def redraw(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def routing_gap(model, ids):
    """Smallest gap, over MoE layers and tokens, between the k-th and (k+1)-th affinity + bias."""
    gaps = []

    def hook(module, inputs, output):
        x = inputs[0].reshape(-1, module.weight.shape[1]).float()
        s = torch.sigmoid(x @ module.weight.float().T) + module.e_score_correction_bias
        top = s.sort(dim=-1, descending=True).values
        gaps.append((top[:, module.top_k - 1] - top[:, module.top_k]).min().item())

    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
    with torch.no_grad():
        model(ids[None])
    for h in handles:
        h.remove()
    return min(gaps)


def main():
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, CONFIG["vocab_size"], (T,), generator=gen)
    reference = {}
    state = None
    for name, interleave in (("hf_dsv3_tiny", True), ("hf_dsv3_rotate_half", False)):
        torch.manual_seed(0)
        model = DeepseekV3ForCausalLM(DeepseekV3Config(rope_interleave=interleave, **CONFIG)).eval()
        if state is None:
            redraw(model, gen)
            state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            model.load_state_dict(state)
        out_dir = os.path.join(FIXTURES, name)
        shutil.rmtree(out_dir, ignore_errors=True)
        model.save_pretrained(out_dir)
        loaded = DeepseekV3ForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float32).eval()
        gap = routing_gap(loaded, ids)
        with torch.no_grad():
            logits = loaded(ids[None]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item()
        print(f"{name}: transformers {transformers.__version__}, torch {torch.__version__}, loss {loss:.6f}, "
              f"logit scale {logits.abs().max().item():.2f}, smallest routing gap {gap:.4f}, "
              f"files {sorted(os.listdir(out_dir))}")
        reference[name] = {"ids": ids.tolist(), "logits": [float(x) for x in logits.reshape(-1)], "loss": loss}
    with open(os.path.join(FIXTURES, "hf_dsv3_reference.json"), "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()
