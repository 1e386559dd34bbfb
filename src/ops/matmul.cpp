// linear and matmul: validation, the GEMM calls, and hand-written backward formulas.
//
// Legend: M rows, K reduction, N columns; "..." leading (batch) dimensions, flattened into Bt batches.
//
//   linear  y = x W^T + b      dx = dy W      dW = dy^T x     db = sum_rows(dy)        (W: [out, in])
//           y = x W + b        dx = dy W^T    dW = x^T dy     db = sum_rows(dy)        (W: [in, out])
//   matmul  C = op(A) op(B)    dA = dC op(B)^T (stored as A is)   dB = op(A)^T dC (stored as B is)
//
// Only the gradients that ctx.needs_input_grad(i) asks for are computed. Gradients are fresh f32
// tensors (the engine sums and accumulates them).
//
// Dtypes: f32; bf16 A/B (f32 accumulation, f32 result) in forward. Recording autodiff through bf16
// inputs is an error for now (the backward GEMMs would need a mixed-dtype path).
//
// Devices: every GEMM goes through gemm_any, which calls the CPU kernels or, for CUDA tensors, cuBLASLt
// (backends/cuda/gemm.h: the same row-major contract, the bias in the epilogue); the bias gradient's
// column sums have a kernel on each backend too.
#include "ops/matmul.h"

#include "backends/backend.h"
#include "backends/cpu/gemm.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/gemm.h"
#include "core/autograd.h"

namespace loom::ops {
namespace {

// One strided GEMM over f32 or bf16 operands (both the same dtype); C is f32.
struct Operand {
  const void* data;
  int64_t ld;
  int64_t stride;  // between batches; 0 = shared
};

void gemm_any(Device device, DType dtype, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
              Operand a, Operand b, float beta, float* C, int64_t ldc, int64_t stride_c,
              const float* bias = nullptr) {
  if (device.is_cuda()) {
    cuda::GemmProblem p;
    p.trans_a = ta;
    p.trans_b = tb;
    p.M = M, p.N = N, p.K = K, p.alpha = alpha, p.beta = beta;
    p.A = a.data, p.lda = a.ld, p.B = b.data, p.ldb = b.ld, p.C = C, p.ldc = ldc;
    p.input = dtype;
    p.output = DType::F32;
    p.bias = bias;
    p.epilogue = bias != nullptr ? cuda::GemmEpilogue::Bias : cuda::GemmEpilogue::None;
    p.batch = batch, p.stride_a = a.stride, p.stride_b = b.stride, p.stride_c = stride_c;
    cuda::gemm(cuda_context("gemm", device), p);
    return;
  }
  if (dtype == DType::F32) {
    const auto* A = static_cast<const float*>(a.data);
    const auto* B = static_cast<const float*>(b.data);
    if (bias != nullptr) {
      LOOM_ASSERT(batch == 1 && alpha == 1.0f);
      cpu::gemm_bias(ta, tb, M, N, K, A, a.ld, B, b.ld, bias, beta, C, ldc);
    } else if (batch == 1) {
      cpu::gemm(ta, tb, M, N, K, alpha, A, a.ld, B, b.ld, beta, C, ldc);
    } else {
      cpu::gemm_batched(ta, tb, batch, M, N, K, alpha, A, a.ld, a.stride, B, b.ld, b.stride, beta, C, ldc,
                        stride_c);
    }
  } else {
    LOOM_ASSERT(dtype == DType::BF16);
    const auto* A = static_cast<const bf16*>(a.data);
    const auto* B = static_cast<const bf16*>(b.data);
    if (bias != nullptr) {
      LOOM_ASSERT(batch == 1 && alpha == 1.0f);
      cpu::gemm_bias_bf16(ta, tb, M, N, K, A, a.ld, B, b.ld, bias, beta, C, ldc);
    } else if (batch == 1) {
      cpu::gemm_bf16(ta, tb, M, N, K, alpha, A, a.ld, B, b.ld, beta, C, ldc);
    } else {
      cpu::gemm_batched_bf16(ta, tb, batch, M, N, K, alpha, A, a.ld, a.stride, B, b.ld, b.stride, beta, C,
                             ldc, stride_c);
    }
  }
}

// The backward's GEMMs in the CPU kernels' argument order, on `device`.
void gemm_f32(Device device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any(device, DType::F32, ta, tb, 1, M, N, K, alpha, {A, lda, 0}, {B, ldb, 0}, beta, C, ldc, 0);
}
void gemm_batched_f32(Device device, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta,
                      float* C, int64_t ldc, int64_t sc) {
  if (device.is_cpu()) {  // the CPU's batched kernel even for one batch, as before
    cpu::gemm_batched(ta, tb, batch, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc);
    return;
  }
  gemm_any(device, DType::F32, ta, tb, batch, M, N, K, alpha, {A, lda, sa}, {B, ldb, sb}, beta, C, ldc, sc);
}
void gemm_bf16_any(Device device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any(device, DType::BF16, ta, tb, 1, M, N, K, alpha, {A, lda, 0}, {B, ldb, 0}, beta, C, ldc, 0);
}
// out[n] = sum over rows of x[M, N] (the bias gradient), rows in order on either backend.
void sum_rows_any(Device device, const float* x, int64_t M, int64_t N, float* out) {
  if (device.is_cuda()) {
    cuda::sum_rows(cuda_context("linear backward", device), x, M, N, out);
  } else {
    cpu::sum_rows(x, M, N, out);
  }
}

void check_float_operands(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  LOOM_CHECK(a.defined() && b.defined(), op, ": ", an, " and ", bn, " must be defined");
  LOOM_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16, op, ": ", an, " is ", a.dtype(),
             ", expected f32 or bf16");
  LOOM_CHECK(a.dtype() == b.dtype(), op, ": ", an, " is ", a.dtype(), " but ", bn, " is ", b.dtype(),
             " (both must have the same dtype)");
  check_same_device(a, b, op);
}

void check_bf16_not_recorded(const TensorList& inputs, DType dtype, const char* op) {
  LOOM_CHECK(dtype == DType::F32 || !autograd::any_requires_grad(inputs), op,
             ": backward through bf16 inputs is not supported yet; run it under NoGradGuard or use f32");
}

}  // namespace

namespace {

// linear() in MatmulPrecision::BF16: the operands of all three GEMMs are bf16 (x and w rounded here
// unless they come rounded: a bf16 x, the caller's w_bf16); the saved activations for backward are the
// bf16 operands too (half the memory of f32). dx is f32 whatever x's dtype: the gradient flowing back
// into the residual stream is not rounded.
Tensor linear_bf16(const Tensor& x, const Tensor& w, const Tensor& w_bf16, const Tensor& bias, bool out_in,
                   int64_t M, int64_t in, int64_t out) {
  Tensor xb = x.dtype() == DType::BF16 ? x : x.to(DType::BF16);
  Tensor wb = w_bf16.defined() ? w_bf16 : w.to(DType::BF16);
  Tensor y = autograd::recall_output();  // selective recomputation: the first run's product
  if (!y.defined()) {
    y = Tensor::empty(x.shape().with_last(out), DType::F32, x.device());
    gemm_any(x.device(), DType::BF16, false, out_in, 1, M, out, in, 1.0f, {xb.raw_data(), in, 0},
             {wb.raw_data(), out_in ? in : out, 0}, 0.0f, y.data<float>(), out, 0,
             bias.defined() ? bias.data<float>() : nullptr);
  }
  autograd::remember_output(y);
  autograd::record("linear_bf16", {x, w, bias}, {y}, [xb, wb, x_shape = x.shape(), w_shape = w.shape(),
                                                      has_bias = bias.defined(), out_in, M, in, out](
                                                         const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);  // [..., out] -> [M, out]
    const Device device = dispatch_device("linear backward", {&dy, &xb});
    Tensor dyb = dy.to(DType::BF16);
    const bf16* pdy = dyb.data<bf16>();
    Tensor dx, dw, db;
    if (ctx.needs_input_grad(0)) {
      dx = Tensor::empty(x_shape, DType::F32, dy.device());
      gemm_bf16_any(device, false, !out_in, M, in, out, 1.0f, pdy, out, wb.data<bf16>(), out_in ? in : out, 0.0f,
                     dx.data<float>(), in);
    }
    if (ctx.needs_input_grad(1)) {
      dw = Tensor::empty(w_shape, DType::F32, dy.device());
      if (out_in) {
        gemm_bf16_any(device, true, false, out, in, M, 1.0f, pdy, out, xb.data<bf16>(), in, 0.0f, dw.data<float>(), in);
      } else {
        gemm_bf16_any(device, true, false, in, out, M, 1.0f, xb.data<bf16>(), in, pdy, out, 0.0f, dw.data<float>(), out);
      }
    }
    if (has_bias && ctx.needs_input_grad(2)) {
      db = Tensor::empty(Shape{out}, DType::F32, dy.device());
      sum_rows_any(device, dy.data<float>(), M, out, db.data<float>());
    }
    return TensorList{dx, dw, db};
  });
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout, MatmulPrecision precision,
              const Tensor& w_bf16) {
  // Mixed precision takes a bf16 x with the f32 master w; otherwise both have one dtype.
  const bool mixed = precision == MatmulPrecision::BF16 && w.defined() && w.dtype() == DType::F32;
  if (mixed && x.defined() && x.dtype() == DType::BF16) {
    check_same_device(x, w, "linear");
  } else {
    check_float_operands(x, w, "linear", "x", "w");
  }
  LOOM_CHECK(x.ndim() >= 1, "linear: x must have at least one dimension, got ", x.describe());
  check_ndim(w, 2, "linear", "w");
  dispatch_device("linear", {&x, &w, &bias});  // one usable device (errors name the op)
  const bool out_in = layout == WeightLayout::OutIn;
  const int64_t in = x.size(-1);
  const int64_t w_in = out_in ? w.size(1) : w.size(0);
  const int64_t out = out_in ? w.size(0) : w.size(1);
  LOOM_CHECK(w_in == in, "linear: x has in=", in, " features but w has shape ", w.shape(), " (",
             out_in ? "[out, in]" : "[in, out]", " layout)");
  if (bias.defined()) {
    check_dtype(bias, DType::F32, "linear", "bias");
    LOOM_CHECK(bias.ndim() == 1 && bias.size(0) == out, "linear: bias has shape ", bias.shape(),
               " but the layer has out=", out);
  }
  const int64_t M = x.shape().numel_before(-1);  // not numel / in: in may be 0
  if (w_bf16.defined()) {
    LOOM_CHECK(mixed, "linear: w_bf16 is for MatmulPrecision::BF16 with an f32 w, got w ", w.describe());
    LOOM_CHECK(w_bf16.dtype() == DType::BF16 && w_bf16.shape() == w.shape(), "linear: w_bf16 is ", w_bf16.describe(),
               " but w is ", w.describe(), " (it must be w's bf16 copy)");
    check_same_device(w, w_bf16, "linear");
  }
  if (mixed) return linear_bf16(x, w, w_bf16, bias, out_in, M, in, out);
  check_bf16_not_recorded({x, w, bias}, x.dtype(), "linear");

  // Under selective recomputation (autograd::checkpoint) the second run takes the first run's product.
  Tensor y = autograd::recall_output();
  if (!y.defined()) {
    y = Tensor::empty(x.shape().with_last(out), DType::F32, x.device());
    // y[M,out] = x[M,in] @ op(w); op(w) = w^T for [out,in] storage.
    gemm_any(x.device(), x.dtype(), false, out_in, 1, M, out, in, 1.0f, {x.raw_data(), in, 0},
             {w.raw_data(), out_in ? in : out, 0}, 0.0f, y.data<float>(), out, 0,
             bias.defined() ? bias.data<float>() : nullptr);
  }
  autograd::remember_output(y);

  autograd::record("linear", {x, w, bias}, {y}, [x, w, has_bias = bias.defined(), out_in, M, in, out](
                                                     const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);  // [..., out] -> [M, out]
    const Device device = dispatch_device("linear backward", {&dy, &x, &w});
    const float* pdy = dy.data<float>();
    Tensor dx, dw, db;
    if (ctx.needs_input_grad(0)) {
      // dx[M,in] = dy[M,out] @ W[out,in]   (or dy @ W^T for W: [in,out])
      dx = Tensor::empty(x.shape(), DType::F32, x.device());
      gemm_f32(device, false, !out_in, M, in, out, 1.0f, pdy, out, w.data<float>(), out_in ? in : out, 0.0f,
                dx.data<float>(), in);
    }
    if (ctx.needs_input_grad(1)) {
      dw = Tensor::empty(w.shape(), DType::F32, w.device());
      if (out_in) {  // dW[out,in] = dy^T[out,M] @ x[M,in]
        gemm_f32(device, true, false, out, in, M, 1.0f, pdy, out, x.data<float>(), in, 0.0f, dw.data<float>(), in);
      } else {  // dW[in,out] = x^T[in,M] @ dy[M,out]
        gemm_f32(device, true, false, in, out, M, 1.0f, x.data<float>(), in, pdy, out, 0.0f, dw.data<float>(), out);
      }
    }
    if (has_bias && ctx.needs_input_grad(2)) {
      db = Tensor::empty(Shape{out}, DType::F32, dy.device());
      sum_rows_any(device, pdy, M, out, db.data<float>());
    }
    return TensorList{dx, dw, db};
  });
  return y;
}

Tensor linear_recomputed_input(const Tensor& x, const Tensor& w, std::function<Tensor()> recompute) {
  const char* op = "linear_recomputed_input";
  check_float_operands(x, w, op, "x", "w");
  check_dtype(x, DType::F32, op, "x");
  LOOM_CHECK(x.ndim() >= 1, op, ": x must have at least one dimension, got ", x.describe());
  check_ndim(w, 2, op, "w");
  LOOM_CHECK(recompute != nullptr, op, ": no recompute function");
  dispatch_device(op, {&x, &w});
  const int64_t in = x.size(-1), out = w.size(0);
  LOOM_CHECK(w.size(1) == in, op, ": x has in=", in, " features but w has shape ", w.shape(), " ([out, in] layout)");
  const int64_t M = x.shape().numel_before(-1);
  Tensor y = autograd::recall_output();
  if (!y.defined()) {  // linear()'s GEMM, so y has its bits
    y = Tensor::empty(x.shape().with_last(out), DType::F32, x.device());
    gemm_any(x.device(), x.dtype(), false, true, 1, M, out, in, 1.0f, {x.raw_data(), in, 0}, {w.raw_data(), in, 0},
             0.0f, y.data<float>(), out, 0, nullptr);
  }
  autograd::remember_output(y);
  autograd::record(op, {x, w}, {y}, [w, recompute = std::move(recompute), x_shape = x.shape(), M, in, out](
                                        const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);  // [M, out]
    const Device device = dispatch_device("linear_recomputed_input backward", {&dy, &w});
    const float* pdy = dy.data<float>();
    Tensor dx, dw;
    if (ctx.needs_input_grad(0)) {  // dx[M,in] = dy[M,out] @ W[out,in]
      dx = Tensor::empty(x_shape, DType::F32, dy.device());
      gemm_f32(device, false, false, M, in, out, 1.0f, pdy, out, w.data<float>(), in, 0.0f, dx.data<float>(), in);
    }
    if (ctx.needs_input_grad(1)) {  // dW[out,in] = dy^T[out,M] @ x[M,in], x rebuilt
      Tensor x;
      {
        autograd::NoGradGuard no_grad;
        x = recompute();
      }
      LOOM_CHECK(x.defined() && x.shape() == x_shape && x.dtype() == DType::F32, "linear_recomputed_input backward: "
                 "the recomputed input is ", x.defined() ? x.describe() : "undefined", ", not the f32 ", x_shape, " it replaces");
      dw = Tensor::empty(w.shape(), DType::F32, w.device());
      gemm_f32(device, true, false, out, in, M, 1.0f, pdy, out, x.data<float>(), in, 0.0f, dw.data<float>(), in);
    }
    return TensorList{dx, dw};
  });
  return y;
}

namespace {
constexpr int64_t kTileRows = 256;  // rows of W dequantized at once: 256 x in f32 (576 KiB at in = 576)
}  // namespace

Tensor dequantized_linear(const Tensor& x, std::shared_ptr<const quant::QuantizedMatrix> w, const Tensor& bias,
                          const std::string& name) {
  LOOM_CHECK(w != nullptr, name, ": no quantized weight");
  LOOM_CHECK(x.defined() && x.dtype() == DType::F32 && x.device().is_cpu() && x.ndim() >= 1, name,
             ": a quantized weight multiplies f32 CPU activations, got ", x.defined() ? x.describe() : "undefined");
  const int64_t in = x.size(-1), out = w->rows();
  LOOM_CHECK(in == w->cols(), name, ": x has in=", in, " features but the quantized weight is [", out, ", ", w->cols(), "]");
  if (bias.defined()) {
    LOOM_CHECK(bias.dtype() == DType::F32 && bias.ndim() == 1 && bias.size(0) == out, name, ": bias is ",
               bias.describe(), " but the layer has out=", out);
  }
  const int64_t M = x.shape().numel_before(-1);  // not numel / in: in may be 0
  Tensor y = Tensor::empty(x.shape().with_last(out));
  {
    std::vector<float> tile(static_cast<size_t>(std::min(kTileRows, out) * in));
    for (int64_t n0 = 0; n0 < out; n0 += kTileRows) {
      const int64_t n = std::min(kTileRows, out - n0);
      w->dequantize_rows(n0, n, tile.data());
      // y[:, n0:n0+n] = x[M, in] @ tile[n, in]^T
      cpu::gemm(false, true, M, n, in, 1.0f, x.data<float>(), in, tile.data(), in, 0.0f, y.data<float>() + n0, out);
    }
    if (bias.defined()) {
      const float* b = bias.data<float>();
      float* py = y.data<float>();
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t j = 0; j < out; ++j) py[m * out + j] += b[j];
      }
    }
  }
  autograd::record("dequantized_linear", {x, bias}, {y}, [w, x_shape = x.shape(), has_bias = bias.defined(), M, in, out](
                                                             const autograd::BackwardContext& ctx) {
    const Tensor& dy = ctx.grad_output(0);  // [..., out] -> [M, out]
    Tensor dx, db;
    if (ctx.needs_input_grad(0)) {
      // dx[M, in] = sum over tiles dy[:, n0:n0+n] @ tile[n, in]
      dx = Tensor::empty(x_shape, DType::F32);
      std::vector<float> tile(static_cast<size_t>(std::min(kTileRows, out) * in));
      for (int64_t n0 = 0; n0 < out; n0 += kTileRows) {
        const int64_t n = std::min(kTileRows, out - n0);
        w->dequantize_rows(n0, n, tile.data());
        cpu::gemm(false, false, M, in, n, 1.0f, dy.data<float>() + n0, out, tile.data(), in, n0 == 0 ? 0.0f : 1.0f,
                  dx.data<float>(), in);
      }
    }
    if (has_bias && ctx.needs_input_grad(1)) {
      db = Tensor::empty(Shape{out}, DType::F32);
      cpu::sum_rows(dy.data<float>(), M, out, db.data<float>());
    }
    return TensorList{dx, db};
  });
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  check_float_operands(a, b, "matmul", "a", "b");
  LOOM_CHECK(a.ndim() >= 2, "matmul: a must have at least 2 dimensions, got ", a.describe());
  LOOM_CHECK(b.ndim() >= 2, "matmul: b must have at least 2 dimensions, got ", b.describe());
  dispatch_device("matmul", {&a, &b});  // one usable device (errors name the op)
  const bool shared_b = b.ndim() == 2 && a.ndim() > 2;
  LOOM_CHECK(shared_b || a.ndim() == b.ndim(), "matmul: a has shape ", a.shape(), " and b has shape ", b.shape(),
             ": b must be 2-D or have a's number of dimensions");
  if (!shared_b) {
    LOOM_CHECK(a.shape().drop_last(2) == b.shape().drop_last(2), "matmul: leading dimensions differ: a ",
               a.shape(), " vs b ", b.shape());
  }
  const int64_t M = transpose_a ? a.size(-1) : a.size(-2);
  const int64_t K = transpose_a ? a.size(-2) : a.size(-1);
  const int64_t Kb = transpose_b ? b.size(-1) : b.size(-2);
  const int64_t N = transpose_b ? b.size(-2) : b.size(-1);
  LOOM_CHECK(K == Kb, "matmul: a ", a.shape(), (transpose_a ? " (transposed)" : ""), " has K=", K, " but b ",
             b.shape(), (transpose_b ? " (transposed)" : ""), " has K=", Kb);
  check_bf16_not_recorded({a, b}, a.dtype(), "matmul");

  const int64_t batch = a.shape().numel_before(-2);
  const int64_t lda = a.size(-1), ldb = b.size(-1);
  const int64_t sa = M * K, sb = shared_b ? 0 : K * N, sc = M * N;
  Shape out_shape = a.shape().drop_last(2);
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor c = Tensor::empty(out_shape, DType::F32, a.device());
  if (shared_b && !transpose_a) {
    // a's batches stack into one tall matrix: a single [batch*M, K] @ op(b) GEMM.
    gemm_any(a.device(), a.dtype(), false, transpose_b, 1, batch * M, N, K, 1.0f, {a.raw_data(), lda, 0},
             {b.raw_data(), ldb, 0}, 0.0f, c.data<float>(), N, 0);
  } else {
    gemm_any(a.device(), a.dtype(), transpose_a, transpose_b, batch, M, N, K, 1.0f, {a.raw_data(), lda, sa},
             {b.raw_data(), ldb, sb}, 0.0f, c.data<float>(), N, sc);
  }

  autograd::record("matmul", {a, b}, {c}, [a, b, transpose_a, transpose_b, shared_b, batch, M, N, K](
                                              const autograd::BackwardContext& ctx) {
    const Tensor& dct = ctx.grad_output(0);
    const Device device = dispatch_device("matmul backward", {&dct, &a, &b});
    const float* dc = dct.data<float>();  // [..., M, N]
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    const int64_t lda = a.size(-1), ldb = b.size(-1);
    const int64_t sa = M * K, sb = shared_b ? 0 : K * N, sc = M * N;
    Tensor da, db;
    if (ctx.needs_input_grad(0)) {
      da = Tensor::empty(a.shape(), DType::F32, a.device());
      if (!transpose_a) {
        // dA[M,K] = dC[M,N] @ op(B)^T: op(B)^T is B itself when B is stored [N,K].
        const int64_t rows = shared_b ? batch * M : M;
        gemm_batched_f32(device, false, !transpose_b, shared_b ? 1 : batch, rows, K, N, 1.0f, dc, N, sc, pb, ldb, sb,
                          0.0f, da.data<float>(), K, sa);
      } else {
        // A stored [K,M]: dA_stored[K,M] = op(B)[K,N] @ dC^T[N,M].
        gemm_batched_f32(device, transpose_b, true, batch, K, M, N, 1.0f, pb, ldb, sb, dc, N, sc, 0.0f,
                          da.data<float>(), M, sa);
      }
    }
    if (ctx.needs_input_grad(1)) {
      db = Tensor::empty(b.shape(), DType::F32, b.device());
      float* pdb = db.data<float>();
      if (!shared_b) {
        if (!transpose_b) {  // dB[K,N] = op(A)^T[K,M] @ dC[M,N]
          gemm_batched_f32(device, !transpose_a, false, batch, K, N, M, 1.0f, pa, lda, sa, dc, N, sc, 0.0f, pdb, N,
                            K * N);
        } else {  // B stored [N,K]: dB_stored[N,K] = dC^T[N,M] @ op(A)[M,K]
          gemm_batched_f32(device, true, transpose_a, batch, N, K, M, 1.0f, dc, N, sc, pa, lda, sa, 0.0f, pdb, K,
                            K * N);
        }
      } else if (!transpose_a) {
        // Shared B: the batches stack into the reduction, one GEMM over batch*M rows.
        if (!transpose_b) {
          gemm_f32(device, true, false, K, N, batch * M, 1.0f, pa, lda, dc, N, 0.0f, pdb, N);
        } else {
          gemm_f32(device, true, false, N, K, batch * M, 1.0f, dc, N, pa, lda, 0.0f, pdb, K);
        }
      } else {
        // Shared B with transposed A: sum the per-batch products in batch order (beta = 1 after the first).
        for (int64_t i = 0; i < batch; ++i) {
          const float beta = i == 0 ? 0.0f : 1.0f;
          if (!transpose_b) {  // dB[K,N] += A_i[K,M] @ dC_i[M,N]
            gemm_f32(device, false, false, K, N, M, 1.0f, pa + i * sa, lda, dc + i * sc, N, beta, pdb, N);
          } else {  // dB[N,K] += dC_i^T[N,M] @ A_i^T[M,K]
            gemm_f32(device, true, true, N, K, M, 1.0f, dc + i * sc, N, pa + i * sa, lda, beta, pdb, K);
          }
        }
      }
    }
    return TensorList{da, db};
  });
  return c;
}

}  // namespace loom::ops
