// The built-in presets of the gpt2 family, compiled in so that `--config NAME` works from any
// directory. Generated from configs/*.json by tools/embed_presets.sh; tests/trainkit/config_test.cpp
// fails if a copy here differs from its file, so edit the JSON file and rerun the script.
#include "models/gpt2/family.h"

namespace loom::gpt2 {
namespace {
constexpr const char* kGpt2Austen = R"json({
  "description": "A small GPT-2 on Jane Austen with GPT-2's own tokenizer, a few minutes on 2 cores: 4 layers, d 128, tied head, dropout 0.1, 400 steps of 8x128 tokens.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 128,
    "d_model": 128,
    "num_layers": 4,
    "num_heads": 4,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": true,
    "output_proj_bias": true,
    "tie_embeddings": true,
    "dropout": 0.1
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
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 400,
    "batch_size": 8,
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
constexpr const char* kGpt2Large = R"json({
  "description": "GPT-2 large (d 1280, 36 layers, 20 heads): tied head, biases.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 1024,
    "d_model": 1280,
    "num_layers": 36,
    "num_heads": 20,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": true,
    "output_proj_bias": true,
    "tie_embeddings": true,
    "dropout": 0.0
  },
  "optimizer": {
    "lr": 0.00025,
    "min_lr": 2.5e-05,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 200,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 10000,
    "batch_size": 2,
    "grad_accum_steps": 32,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 20
  },
  "checkpoint": {
    "interval": 500,
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
    "max_new_tokens": 40,
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
constexpr const char* kGpt2Medium = R"json({
  "description": "GPT-2 medium (d 1024, 24 layers, 16 heads): tied head, biases.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 1024,
    "d_model": 1024,
    "num_layers": 24,
    "num_heads": 16,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": true,
    "output_proj_bias": true,
    "tie_embeddings": true,
    "dropout": 0.0
  },
  "optimizer": {
    "lr": 0.0003,
    "min_lr": 3e-05,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 200,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 10000,
    "batch_size": 4,
    "grad_accum_steps": 16,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 20
  },
  "checkpoint": {
    "interval": 500,
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
    "max_new_tokens": 40,
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
constexpr const char* kGpt2SmallUntied = R"json({
  "description": "The seed series' GPT-2 small (163,009,536 parameters): untied head, no q/k/v bias, a bias on the attention output projection.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 1024,
    "d_model": 768,
    "num_layers": 12,
    "num_heads": 12,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": false,
    "output_proj_bias": true,
    "tie_embeddings": false,
    "dropout": 0.0
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
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 10000,
    "batch_size": 8,
    "grad_accum_steps": 8,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 20
  },
  "checkpoint": {
    "interval": 500,
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
    "max_new_tokens": 40,
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
constexpr const char* kGpt2Small = R"json({
  "description": "GPT-2 small as OpenAI released it (124,439,808 parameters): tied head, q/k/v and output-projection biases, GPT-2's tokenizer. Trains on the Austen tokens as a placeholder: point data.* at your own corpus.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 1024,
    "d_model": 768,
    "num_layers": 12,
    "num_heads": 12,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": true,
    "output_proj_bias": true,
    "tie_embeddings": true,
    "dropout": 0.0
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
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 10000,
    "batch_size": 8,
    "grad_accum_steps": 8,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 20
  },
  "checkpoint": {
    "interval": 500,
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
    "max_new_tokens": 40,
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
constexpr const char* kGpt2Xl = R"json({
  "description": "GPT-2 XL (d 1600, 48 layers, 25 heads): tied head, biases.",
  "model": {
    "arch": "gpt2",
    "vocab_size": 50257,
    "context_length": 1024,
    "d_model": 1600,
    "num_layers": 48,
    "num_heads": 25,
    "d_ff": 0,
    "norm_eps": 1e-05,
    "qkv_bias": true,
    "output_proj_bias": true,
    "tie_embeddings": true,
    "dropout": 0.0
  },
  "optimizer": {
    "lr": 0.0002,
    "min_lr": 2e-05,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip": 1.0
  },
  "schedule": {
    "warmup_steps": 200,
    "cosine_steps": 0
  },
  "data": {
    "corpus": "data/austen",
    "val_fraction": 0.1,
    "tokenizer": "data/gpt2",
    "train": "data/austen_gpt2/train.bin",
    "val": "data/austen_gpt2/val.bin"
  },
  "training": {
    "max_steps": 10000,
    "batch_size": 1,
    "grad_accum_steps": 64,
    "seed": 1337,
    "threads": 0,
    "sampling": "random",
    "precision": "bf16"
  },
  "eval": {
    "interval": 250,
    "batches": 20
  },
  "checkpoint": {
    "interval": 500,
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
    "max_new_tokens": 40,
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
      {"gpt2-austen", kGpt2Austen},
      {"gpt2-large", kGpt2Large},
      {"gpt2-medium", kGpt2Medium},
      {"gpt2-small-untied", kGpt2SmallUntied},
      {"gpt2-small", kGpt2Small},
      {"gpt2-xl", kGpt2Xl},
  };
}

}  // namespace loom::gpt2
