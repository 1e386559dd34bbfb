// The attention problem every backend's flash and masked kernels take (backends/cpu/attention.h,
// backends/cuda/attention.h): heads, lengths, layouts, the causal rule, grouped-query heads, fused RoPE,
// dropout's counter and bf16 products. Written once here so that the CPU and CUDA kernels and the op
// (ops/attention.cpp) share one contract.
//
// Legend: B batch, H heads per batch entry, N = B*H independent attention problems ("heads"),
// Tq/Tk query/key lengths, D q/k head dimension, Dv value head dimension.
#pragma once

#include <cstdint>

#include "core/rng.h"

namespace loom {

// Where an operand's rows live: head n = b * heads_per_batch + h has row t at
//   base + b * batch_stride + h * head_stride + t * row_stride   (elements are contiguous in a row).
// [N, T, D] tensors: {T*D, 0, D} with heads_per_batch = 1. [B, T, H*D] projections: {T*H*D, D, H*D}.
struct HeadLayout {
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
};

// Optional RoPE applied to q and k rows before attention (and its inverse to dq, dk).
struct RopeTables {
  const float* cos = nullptr;  // [P, D/2]; row for (b, t) is b * batch_stride + t
  const float* sin = nullptr;
  int64_t batch_stride = 0;    // 0 when positions are shared by the batch ([T]), T for [B, T]
  bool interleaved = true;
};

struct AttentionProblem {
  int64_t batches = 1;
  int64_t heads_per_batch = 1;
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;  // query i sees keys j <= i + (tk - tq)
  // Grouped-query attention: query heads h of one batch entry read k/v head h / kv_group, so k and v
  // have heads_per_batch / kv_group heads (1 = ordinary multi-head attention). dk/dv sum over a group.
  int64_t kv_group = 1;
  HeadLayout q, k, v, out;  // gradients use the layout of the tensor they belong to
  RopeTables rope;          // flash kernels only; cos == nullptr means no RoPE
  // Document masking (several documents packed into one row): query row i of batch entry b sees no key
  // before key_begin[b * tq + i] (the first position of its document), on top of the causal rule, so the
  // mask is block-diagonal causal without a [Tq, Tk] tensor. nullptr: every row from key 0. CPU flash
  // kernels only.
  const int32_t* key_begin = nullptr;
  // Inverted dropout on the probabilities, as F.dropout(softmax(S), p) (flash kernels only): out_i =
  // sum_j Z_ij P_ij v_j with Z_ij = keep(n, i, j) / (1 - p), P the softmax normalised WITHOUT dropout,
  // keep(n, i, j) = !(random_uniform(dropout_key, attention_dropout_counter(*this, n, i, j)) < p).
  // 0 = no dropout: the kernels then take exactly the code path they take without it.
  float dropout_p = 0.0f;
  RngKey dropout_key;
  // bf16 products (mixed precision, as SDPA under torch.autocast(bfloat16) and FlashAttention-2's bf16
  // kernels): the flash kernels round the operands of their five products (q, k, v, dO as they are
  // packed; P and dS as they form) to bf16, nearest even, and multiply them with f32 accumulation by
  // `vdpbf16ps`. Scores, the online softmax, lse, D_i and dS themselves stay f32, as do inputs and outputs.
  // Only the AVX-512 copy on a CPU with AVX512-BF16 has these products (flash_attention_uses_bf16); the
  // other CPU copies (no bf16 unit to gain speed from) and the masked kernels compute in f32 as without
  // the flag, and CUDA ignores it (its kernels take bf16 tensors for that).
  bool bf16_products = false;

  int64_t heads() const { return batches * heads_per_batch; }
  int64_t kv_heads() const { return heads() / kv_group; }
};

// The dropout stream's counter for head n, query row i, key j: row-major over [N, Tq, Tk64], Tk64 = Tk
// rounded up to a multiple of 64. The padding puts every row's first draw on a 64-word Philox tile
// (philox.h), so the kernels draw whole tiles and none is wasted on a neighbouring row.
inline uint64_t attention_dropout_counter(const AttentionProblem& p, int64_t n, int64_t i, int64_t j) {
  const int64_t tk64 = (p.tk + 63) / 64 * 64;
  return static_cast<uint64_t>(n * p.tq + i) * static_cast<uint64_t>(tk64) + static_cast<uint64_t>(j);
}

}  // namespace loom
