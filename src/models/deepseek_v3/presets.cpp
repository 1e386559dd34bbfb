// The built-in presets of the deepseek_v3 family, compiled in so that `--config NAME` works from any
// directory. Generated from configs/*.json by tools/embed_presets.sh; tests/trainkit/config_test.cpp
// fails if a copy here differs from its file, so edit the JSON file and rerun the script.
#include "models/deepseek_v3/family.h"

namespace loom::deepseek_v3 {
namespace {
constexpr const char* kDsv3Austen = R"json({
  "description": "A small DeepSeek-V3 on Jane Austen, a few minutes on 2 cores: d 128, 4 layers (1 dense), MLA (kv_rank 32 + rope 8 cached), 1 shared + 16 routed experts (top 4, the seed's ratio), 1 MTP module; 300 steps of 16x128 tokens.",
  "model": {
    "arch": "deepseek_v3",
    "vocab_size": 2048,
    "context_length": 128,
    "d_model": 128,
    "num_layers": 4,
    "n_dense": 1,
    "num_heads": 4,
    "q_rank": 64,
    "kv_rank": 32,
    "d_nope": 16,
    "d_rope": 8,
    "d_v": 16,
    "d_ff": 384,
    "n_shared": 1,
    "n_routed": 16,
    "top_k": 4,
    "d_expert": 64,
    "route_scale": 1.0,
    "gamma": 0.001,
    "alpha_seq": 0.0001,
    "n_mtp": 1,
    "mtp_lambda": 0.3,
    "rope_theta": 10000.0,
    "init_std": 0.02,
    "norm_eps": 1e-06
  },
  "optimizer": {
    "lr": 0.003,
    "min_lr": 0.0003,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 40,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/austen_bpe2048/tokenizer.json",
    "train": "data/austen_bpe2048/train.bin",
    "val": "data/austen_bpe2048/val.bin"
  },
  "training": {
    "max_steps": 300,
    "batch_size": 16,
    "grad_accum_steps": 1,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "f32"
  },
  "eval": {
    "interval": 100,
    "batches": 8
  },
  "checkpoint": {
    "interval": 200,
    "keep_last": 2
  },
  "logging": {
    "interval": 10,
    "progress": "auto",
    "peak_flops": 0.0
  },
  "sample": {
    "prompt": "Every effort moves you",
    "num_samples": 2,
    "max_new_tokens": 60,
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 1.0
  },
  "parallel": {
    "mode": "dp",
    "mesh": "data=1,tensor=1",
    "max_expert_rows": 0
  }
}
)json";
}  // namespace
namespace {
constexpr const char* kDsv3Mini = R"json({
  "description": "The seed's DeepSeek-V3 (shared/seeds/002): 36.2M parameters, 13.6M used per token; MLA, 1 shared + 16 routed experts (top 4), 1 MTP module; its training recipe (32x256 tokens, AdamW 6e-4 -> 6e-5, 200 warmup, 12000 steps, bf16 GEMMs) on Austen with an 8192-token BPE.",
  "model": {
    "arch": "deepseek_v3",
    "vocab_size": 8192,
    "context_length": 256,
    "d_model": 384,
    "num_layers": 6,
    "n_dense": 1,
    "num_heads": 6,
    "q_rank": 192,
    "kv_rank": 128,
    "d_nope": 32,
    "d_rope": 16,
    "d_v": 32,
    "d_ff": 1024,
    "n_shared": 1,
    "n_routed": 16,
    "top_k": 4,
    "d_expert": 256,
    "route_scale": 1.0,
    "gamma": 0.001,
    "alpha_seq": 0.0001,
    "n_mtp": 1,
    "mtp_lambda": 0.3,
    "rope_theta": 10000.0,
    "init_std": 0.02,
    "norm_eps": 1e-06
  },
  "optimizer": {
    "lr": 0.0006,
    "min_lr": 6e-05,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 200,
    "cosine_steps": 12000
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/austen_bpe8192/tokenizer.json",
    "train": "data/austen_bpe8192/train.bin",
    "val": "data/austen_bpe8192/val.bin"
  },
  "training": {
    "max_steps": 12000,
    "batch_size": 32,
    "grad_accum_steps": 1,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 8
  },
  "checkpoint": {
    "interval": 1000,
    "keep_last": 2
  },
  "logging": {
    "interval": 10,
    "progress": "auto",
    "peak_flops": 0.0
  },
  "sample": {
    "prompt": "It is a truth universally acknowledged",
    "num_samples": 2,
    "max_new_tokens": 100,
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 1.0
  },
  "parallel": {
    "mode": "dp",
    "mesh": "data=1,tensor=1",
    "max_expert_rows": 0
  }
}
)json";
}  // namespace
namespace {
constexpr const char* kDsv3Tiny = R"json({
  "description": "The seed's TINY DeepSeek-V3 test shape (2 layers: 1 dense + 1 MoE of 4 routed experts, top 2) with a 512-token vocabulary: for tests and smoke runs.",
  "model": {
    "arch": "deepseek_v3",
    "vocab_size": 512,
    "context_length": 32,
    "d_model": 32,
    "num_layers": 2,
    "n_dense": 1,
    "num_heads": 2,
    "q_rank": 16,
    "kv_rank": 8,
    "d_nope": 8,
    "d_rope": 4,
    "d_v": 8,
    "d_ff": 64,
    "n_shared": 1,
    "n_routed": 4,
    "top_k": 2,
    "d_expert": 16,
    "route_scale": 1.0,
    "gamma": 0.001,
    "alpha_seq": 0.0001,
    "n_mtp": 1,
    "mtp_lambda": 0.3,
    "rope_theta": 10000.0,
    "init_std": 0.02,
    "norm_eps": 1e-06
  },
  "optimizer": {
    "lr": 0.003,
    "min_lr": 0.0003,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 20,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/austen_bpe512/tokenizer.json",
    "train": "data/austen_bpe512/train.bin",
    "val": "data/austen_bpe512/val.bin"
  },
  "training": {
    "max_steps": 200,
    "batch_size": 8,
    "grad_accum_steps": 1,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "f32"
  },
  "eval": {
    "interval": 50,
    "batches": 4
  },
  "checkpoint": {
    "interval": 100,
    "keep_last": 2
  },
  "logging": {
    "interval": 10,
    "progress": "auto",
    "peak_flops": 0.0
  },
  "sample": {
    "prompt": "Every effort moves you",
    "num_samples": 1,
    "max_new_tokens": 24,
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 1.0
  },
  "parallel": {
    "mode": "dp",
    "mesh": "data=1,tensor=1",
    "max_expert_rows": 0
  }
}
)json";
}  // namespace

std::vector<models::Preset> presets() {
  return {
      {"dsv3-austen", kDsv3Austen},
      {"dsv3-mini", kDsv3Mini},
      {"dsv3-tiny", kDsv3Tiny},
  };
}

}  // namespace loom::deepseek_v3
