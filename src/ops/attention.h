// Attention, differentiable in q, k and v.
//
// Legend: B batch, T sequence, H heads, D head dimension, "..." any leading dimensions.
#pragma once

#include <optional>

#include "core/tensor.h"
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
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool causal = false,
                                    std::optional<float> scale = std::nullopt);

struct RopeOptions {
  Tensor positions;  // i32 [T] or [B, T]
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::Interleaved;
  RopeCache cache;  // optional: angles gathered from here instead of computed
};

// The core of multi-head causal self-attention on projected activations, fused:
//   q, k, v: [B, T, H*D] (what the q/k/v projections produce); splits heads, applies RoPE to q and k
//   when `rope` is given, attends causally (flash-style), and merges heads. Returns [B, T, H*D].
//   num_kv_heads: grouped-query attention, k and v [B, T, Hkv*D] with Hkv dividing H (query head h
//   reads k/v head h / (H / Hkv)); 0 means Hkv = H.
Tensor causal_self_attention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                             const std::optional<RopeOptions>& rope = std::nullopt, int num_kv_heads = 0);

// ---- helpers and the composite reference (MLX-style fallback and test oracle) --------------------

// [B, T, H*D] -> [B, H, T, D] and back, differentiable (each is the other's backward).
Tensor split_heads(const Tensor& x, int num_heads);
Tensor merge_heads(const Tensor& x);

// A [T, T] bool lower-triangular mask (query i may attend keys j <= i).
Tensor causal_mask(int64_t t);

// causal_self_attention composed from basic ops: split_heads, rope on q and k, masked
// scaled_dot_product_attention with causal_mask(T), merge_heads. Same contract and results (up to
// rounding) as the fused op, but materialises [T, T] scores per head: the reference, not the fast path.
Tensor causal_self_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                                       const std::optional<RopeOptions>& rope = std::nullopt, int num_kv_heads = 0);

}  // namespace loom::ops
