// The built-in presets of the llama family, compiled in so that `--config NAME` works from any
// directory. Generated from configs/*.json by tools/embed_presets.sh; tests/trainkit/config_test.cpp
// fails if a copy here differs from its file, so edit the JSON file and rerun the script.
#include "models/llama/family.h"

namespace loom::llama {
namespace {
constexpr const char* kCs336Tinystories = R"json({
  "description": "CS336 assignment 1's TinyStories model: 4 layers, d_model 512, 16 heads, d_ff 1344, 327,680,000 training tokens.",
  "model": {
    "arch": "llama",
    "vocab_size": 10000,
    "context_length": 256,
    "d_model": 512,
    "num_layers": 4,
    "num_heads": 16,
    "num_kv_heads": 0,
    "d_ff": 1344,
    "rope_theta": 10000.0,
    "norm_eps": 1e-05
  },
  "optimizer": {
    "lr": 0.001,
    "min_lr": 0.0001,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 1000,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/tinystories",
    "val_fraction": 0.01,
    "tokenizer": "data/tinystories_bpe10k/tokenizer.json",
    "train": "data/tinystories_bpe10k/train.bin",
    "val": "data/tinystories_bpe10k/val.bin"
  },
  "training": {
    "max_steps": 40000,
    "batch_size": 32,
    "grad_accum_steps": 1,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "f32"
  },
  "eval": {
    "interval": 1000,
    "batches": 20
  },
  "checkpoint": {
    "interval": 2000,
    "keep_last": 3
  },
  "logging": {
    "interval": 50,
    "progress": "auto",
    "peak_flops": 0.0
  },
  "sample": {
    "prompt": "Once upon a time",
    "num_samples": 2,
    "max_new_tokens": 256,
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
constexpr const char* kDefault = R"json({
  "description": "The default run: a small Llama-style model on Jane Austen's novels, a few minutes on 2 cores.",
  "model": {
    "arch": "llama",
    "vocab_size": 2048,
    "context_length": 128,
    "d_model": 256,
    "num_layers": 4,
    "num_heads": 8,
    "num_kv_heads": 0,
    "d_ff": 704,
    "rope_theta": 10000.0,
    "norm_eps": 1e-05
  },
  "optimizer": {
    "lr": 0.002,
    "min_lr": 0.0002,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 100,
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
    "max_steps": 1500,
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
    "interval": 250,
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
    "max_new_tokens": 128,
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
constexpr const char* kTiny = R"json({
  "description": "Tiny model for smoke tests and CI: tens of steps per second on 2 cores.",
  "model": {
    "arch": "llama",
    "vocab_size": 512,
    "context_length": 64,
    "d_model": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 0,
    "d_ff": 192,
    "rope_theta": 10000.0,
    "norm_eps": 1e-05
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
    "batch_size": 16,
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
    "prompt": "It is a truth universally acknowledged",
    "num_samples": 1,
    "max_new_tokens": 64,
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
      {"cs336-tinystories", kCs336Tinystories},
      {"default", kDefault},
      {"tiny", kTiny},
  };
}

}  // namespace loom::llama
