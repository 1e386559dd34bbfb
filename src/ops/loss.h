// Losses, differentiable in the logits.
#pragma once

#include <memory>

#include "core/tensor.h"
#include "ops/matmul.h"

namespace loom::ops {

// Mean cross-entropy of logits [..., V] against targets i32 [...] (same leading shape), computed with
// a stable log-sum-exp. Positions whose target equals ignore_index count neither in the sum nor in the
// mean's denominator. Returns a scalar []. A target outside [0, V) that is not ignore_index is an error.
// Fused: the backward is softmax(logits) - onehot(target), scaled by 1/count.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -100);

// cross_entropy(linear(x, w), targets) without the [N, V] logits: the language-model head and its loss
// fused, as Liger-Kernel's fused linear cross-entropy. x: [..., C]; w: [V, C] (out_in); targets: i32 [...].
// Rows are processed in chunks of `chunk_rows`: logits of a chunk, its loss and softmax - onehot, then
// (when autodiff records) the chunk's contributions to dx = g w and dw += g^T x, so memory is
// O(chunk_rows * V) instead of two [N, V] tensors (1.6 GB each for GPT-2's vocabulary at 8 x 1024
// tokens). The gradients are computed in the forward and rescaled by the upstream gradient in backward.
// precision: as linear()'s, for all three GEMMs; under BF16, x may come already rounded to bf16 (its
// gradient is f32 either way) and w_bf16 is w's bf16 copy, as for linear(). Same results as the unfused
// pair up to the order in which dw sums over chunks.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int32_t ignore_index = -100,
                            MatmulPrecision precision = MatmulPrecision::F32, int64_t chunk_rows = 512,
                            const Tensor& w_bf16 = Tensor());

// linear_cross_entropy with w held in a GGUF block format (QLoRA's head, frozen: ops::dequantized_linear's
// weights): neither the [N, V] logits nor w in f32 ever exist. w is dequantized 256 vocabulary rows at a
// time; a first pass over the tiles computes each row's logits tile by tile and keeps a running max and
// sum (an online log-sum-exp, as flash attention's), a second pass (when autodiff records) recomputes each
// tile's logits, forms (softmax - onehot) / count from the row's log-sum-exp and adds its dx = g w_tile.
// w is dequantized twice, as dequantized_linear's forward and backward do; peak memory O(N * 256).
// Differentiable in x only. x: f32 CPU [..., C]; w: [V, C]; targets: i32 [...] (x's leading shape).
Tensor dequantized_linear_cross_entropy(const Tensor& x, std::shared_ptr<const quant::QuantizedMatrix> w,
                                        const Tensor& targets, int32_t ignore_index = -100);

}  // namespace loom::ops
