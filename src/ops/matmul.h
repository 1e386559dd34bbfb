// Matrix products, differentiable. Kernels: backends/cpu/gemm.* (oneDNN; see docs/gemm.md).
//
// Legend: M rows, K reduction, N columns; "..." any leading (batch) dimensions.
#pragma once

#include <functional>
#include <memory>

#include "core/tensor.h"
#include "quant/qmatmul.h"

namespace loom::ops {

// How a linear layer's weight is stored.
enum class WeightLayout {
  OutIn,  // w: [out, in], PyTorch's and loom's convention: y = x @ w^T
  InOut,  // w: [in, out], JAX/Flax's convention:           y = x @ w
};

// The arithmetic of a linear layer's three GEMMs (forward, dx, dW).
enum class MatmulPrecision {
  F32,   // f32 operands
  BF16,  // mixed precision, as torch.autocast(bfloat16): f32 tensors in and out, the GEMM operands
         // rounded to bf16 (AMX / AVX512-BF16 units), f32 accumulation. Master weights stay f32.
};

// y = x @ W (+ bias). x: [..., in]; w: [out, in] or [in, out] per `layout`; bias: [out] or undefined.
// Returns [..., out] (f32). The leading dimensions of x are flattened into the GEMM's M.
// Under MatmulPrecision::BF16 with an f32 w:
//   * x may be f32 (rounded to bf16 here) or already bf16 (a norm that rounded its output for the GEMMs:
//     no conversion pass, and the bf16 tensor is what backward keeps); its gradient is f32 either way;
//   * w_bf16, when given, is w rounded to bf16 (nn::bf16_weight_of keeps one per trained parameter) and
//     is used instead of converting w on every call.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(),
              WeightLayout layout = WeightLayout::OutIn, MatmulPrecision precision = MatmulPrecision::F32,
              const Tensor& w_bf16 = Tensor());

// y = x W^T (W: [out, in]), f32, like linear(), but its backward keeps no x: dW = dy^T x takes the x that
// recompute() returns then (it must give x's bits; called once, only when W wants its gradient). dx = dy W as
// linear(). For an input that something else already keeps the makings of: the down_proj adapter's
// SwiGLU product, rebuilt from the gate and up that SwiGLU's own backward keeps.
Tensor linear_recomputed_input(const Tensor& x, const Tensor& w, std::function<Tensor()> recompute);

// y = x W^T (+ bias) with W held in a GGUF block format, multiplied by its dequantized values: W is
// dequantized kTileRows rows at a time into an f32 buffer that the f32 GEMM reads, so the whole matrix
// never exists in f32 (QLoRA: the frozen quantized base under LoRA adapters). Exact against the
// dequantized weights, unlike quant::quantized_linear's integer kernels, which round x to 8 bits.
// Differentiable in x (dx = dy W, by the same tiles) and bias; W, frozen, has no gradient.
// x: f32 CPU [..., in]; w: [out, in]; bias: f32 [out] or undefined. Returns f32 [..., out].
Tensor dequantized_linear(const Tensor& x, std::shared_ptr<const quant::QuantizedMatrix> w,
                          const Tensor& bias = Tensor(), const std::string& name = "dequantized_linear");

// Batched matmul: a: [..., M, K] (or [..., K, M] with transpose_a), b: [..., K, N] (or [..., N, K] with
// transpose_b). Leading dimensions must match, or b may be 2-D and is then shared by every batch.
// Returns [..., M, N].
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

}  // namespace loom::ops
