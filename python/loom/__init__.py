"""loom: language models from scratch, in C++, from Python.

numpy arrays in and out (float32 values, integer ids). C++ errors arrive as Python exceptions: a bad
shape, value or file format is ValueError, an unreadable file OSError, an unavailable device
RuntimeError. See docs/python.md.
"""

import os as _os

# GNU OpenMP reads its wait policy when the native library loads (just below): unless the user chose one,
# a bounded spin (GOMP_SPINCOUNT, as the loom CLI sets; see src/core/parallel.h) that keeps the threads
# from burning a shared CPU's time at every barrier. No effect if another module already loaded libgomp.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "10000"

from .checkpoint import load_checkpoint, load_safetensors, save_checkpoint, save_safetensors
from ._loom import cuda_available, cuda_device_count
from .data import check_device, get_batch
from .functional import (cross_entropy, embedding, linear, multihead_self_attention, rms_norm, rope,
                         scaled_dot_product_attention, silu, softmax, swiglu)
from .mesh import (MODES, Mesh, ShardedModel, batch_spec, validate_experts_for_mesh, validate_mesh_for_devices,
                   validate_mesh_for_mode, validate_mode)
from .model import Model, Run, TransformerBlock, TransformerLM, load_run
from .optim import AdamW, clip_grad_norm, cosine_lr
from .tokenizer import Tokenizer, train_bpe
from .training import resolve_config, train

__all__ = [
    "AdamW", "MODES", "Mesh", "Model", "Run", "Tokenizer", "TransformerBlock", "TransformerLM", "check_device",
    "clip_grad_norm", "cosine_lr", "cuda_available", "cuda_device_count",
    "cross_entropy", "embedding", "get_batch", "linear", "load_checkpoint", "load_run", "load_safetensors",
    "multihead_self_attention", "resolve_config", "rms_norm", "rope", "save_checkpoint", "save_safetensors",
    "scaled_dot_product_attention", "ShardedModel", "batch_spec", "silu", "softmax", "swiglu", "train", "train_bpe",
    "validate_experts_for_mesh", "validate_mesh_for_devices", "validate_mesh_for_mode", "validate_mode",
]
