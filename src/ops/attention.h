// Attention, differentiable in q, k and v.
//
// Legend: B batch, T sequence, H heads, D head dimension, "..." any leading dimensions.
#pragma once

#include <optional>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/matmul.h"
#include "ops/rope.h"

namespace loom::ops {

// softmax(q k^T * scale + mask) v.
//   q: [..., Tq, D]; k: [..., Tk, D]; v: [..., Tk, Dv]; leading dimensions equal, except that k and v
//      may have fewer heads in the last leading dimension (grouped-query attention: q [..., Hq, Tq, D],
//      k/v [..., Hkv, Tk, D] with Hkv dividing Hq; query head h reads k/v head h / (Hq / Hkv)).
//   mask: bool [..., Tq, Tk] or [Tq, Tk] (true = may attend), or undefined.
//   causal: query i attends keys j <= i (+ Tk - Tq offset). Computed blockwise with an online softmax:
//           no Tq x Tk matrix is materialised, memory is linear in T (FlashAttention's algorithm).
//   scale: defaults to 1/sqrt(D).
// A query row whose mask allows no key gets zeros (not NaN), and zero gradients.
// Kernels: without a mask, the flash kernels (backends/cpu/attention.h); with a mask, a naive kernel
// that materialises each head's [Tq, Tk] scores (the mask is that size already).
//   precision: BF16 is mixed precision as SDPA under torch.autocast(bfloat16): f32 tensors in and out,
//              the flash kernels' products on bf16-rounded operands with f32 accumulation, where the CPU
//              has a bf16 dot product (AVX512-BF16); elsewhere, with a mask and on CUDA, f32 as F32.
//   key_begin: document masking for packed rows, as causal_self_attention's: i32 [B, T] for q, k, v
//              [B, H, T, D] (k and v with H or fewer heads), causal, no mask; every head of row b reads
//              row b's. In the flash kernels, no [T, T] mask exists. CPU only.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool causal = false,
                                    std::optional<float> scale = std::nullopt,
                                    MatmulPrecision precision = MatmulPrecision::F32, const Tensor& key_begin = Tensor());

struct RopeOptions {
  Tensor positions;  // i32 [T] or [B, T]
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::Interleaved;
  RopeCache cache;  // optional: angles gathered from here instead of computed
};

// Dropout on the attention probabilities (GPT-2's attn_pdrop), as PyTorch's
// F.dropout(softmax(scores), p) (inverted dropout), for causal_self_attention:
//   out_i = sum_j keep(b, h, i, j) * P_ij / (1 - p) * v_j,
// P the ordinary causal softmax (its normaliser computed without dropout), and
//   keep(b, h, i, j) = !(random_uniform(key, ((b*H + h)*T + i)*T64 + j) < p),   T64 = T rounded up to 64
// (h the query head; rows padded to 64 draws so that the kernels draw whole Philox tiles). The mask
// depends on the key and (b, h, i, j) only: the same for any thread count, and redrawn in the backward,
// so nothing of size [T, T] is stored. p = 0 is no dropout (evaluation); in training, use a fresh key
// per step and layer, e.g. key.fold_in(step).fold_in(layer).
struct AttentionDropout {
  float p = 0.0f;  // in [0, 1)
  RngKey key;
};

// The core of multi-head causal self-attention on projected activations, fused:
//   q, k, v: [B, T, H*D] (what the q/k/v projections produce); splits heads, applies RoPE to q and k
//   when `rope` is given, attends causally (flash-style), and merges heads. Returns [B, T, H*D].
//   num_kv_heads: grouped-query attention, k and v [B, T, Hkv*D] with Hkv dividing H (query head h
//   reads k/v head h / (H / Hkv)); 0 means Hkv = H.
//   dropout: on the attention probabilities (see AttentionDropout); p = 0 (the default) runs exactly
//   the kernels and gives exactly the bits of a call without it.
//   precision: as scaled_dot_product_attention's (the model passes its projections' GEMM precision).
//   key_begin: document masking for rows that pack several documents (fine-tuning's packing): i32
//   [B, T], key_begin[b, t] in [0, t] the first position of t's document; query t then attends keys
//   key_begin[b, t] <= j <= t only (block-diagonal causal; RoPE positions restarting per document come
//   through rope.positions [B, T]). Applied inside the flash kernels, key blocks wholly before a query
//   block's documents skipped: no [T, T] mask exists. Undefined: ordinary causal attention. CPU only.
Tensor causal_self_attention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                             const std::optional<RopeOptions>& rope = std::nullopt, int num_kv_heads = 0,
                             const AttentionDropout& dropout = {},
                             MatmulPrecision precision = MatmulPrecision::F32, const Tensor& key_begin = Tensor());

// ---- helpers and the composite reference (MLX-style fallback and test oracle) --------------------

// [B, T, H*D] -> [B, H, T, D] and back, differentiable (each is the other's backward).
Tensor split_heads(const Tensor& x, int num_heads);
Tensor merge_heads(const Tensor& x);

// A [T, T] bool lower-triangular mask (query i may attend keys j <= i).
Tensor causal_mask(int64_t t);

// causal_self_attention composed from basic ops: split_heads, rope on q and k, masked
// scaled_dot_product_attention with causal_mask(T), merge_heads. Same contract and results (up to
// rounding) as the fused op, but materialises [T, T] scores per head: the reference, not the fast path.
// With dropout (p > 0) the attention itself is spelled out instead: scores = q k^T * scale (matmul),
// -inf above the diagonal, softmax, times the [B, H, T, T] tensor keep/(1-p) drawn with random_uniform
// at the indices above, matmul with v; autodiff gives its backward. key_begin (no dropout with it) becomes
// a dense [B, H, T, T] mask.
Tensor causal_self_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                                       const std::optional<RopeOptions>& rope = std::nullopt, int num_kv_heads = 0,
                                       const AttentionDropout& dropout = {}, const Tensor& key_begin = Tensor());

}  // namespace loom::ops
