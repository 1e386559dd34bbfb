// cross_entropy: validation and the fused forward/backward (kernels: backends/cpu/loss.*).
// Legend: N rows (the leading dimensions flattened), V classes.
//
// When autodiff records the op, the forward also writes the gradient (softmax - onehot) / count into a
// saved [N,V] buffer, reusing the exponentials it computes anyway; backward only rescales it by the
// upstream gradient (usually exactly 1, then it is returned as is). Under NoGradGuard nothing is saved.
//
// All targets ignored: the loss is 0 and the gradient is all zeros (PyTorch returns NaN here; a padded
// micro-batch with no real token should not poison a training run).
#include "ops/loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/loss.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/loss.h"
#include "core/autograd.h"
#include "core/parallel.h"

namespace loom::ops {

namespace {

// How many targets are not ignore_index; every other target must be a class in [0, V).
int64_t checked_target_count(const char* op, const Tensor& targets, int64_t V, int32_t ignore_index) {
  const int32_t* pt = targets.data<int32_t>();
  int64_t bad = -1;
  const int64_t count = cpu::cross_entropy_count(pt, targets.numel(), V, ignore_index, &bad);
  LOOM_CHECK(bad < 0, op, ": target ", (bad >= 0 ? pt[bad] : 0), " at flat position ", bad,
             " is outside [0, V) with V=", V, " and is not ignore_index=", ignore_index);
  return count;
}

// The scalar mean of `total` over `count` positions; 0 when every target was ignored.
Tensor mean_loss(double total, int64_t count, Device device) {
  Tensor loss = Tensor::empty(Shape{}, DType::F32, device);
  *loss.data<float>() = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
  return loss;
}

// ---- the CUDA path -----------------------------------------------------------------------------
//
// Everything stays on the device: the target count (for the 1/count gradient scale) and the per-row
// losses are device buffers, the mean is a one-block kernel, and the backward scales by the upstream
// gradient read on the device. Only the validation of the targets reads back (skipped while a CUDA
// graph is being captured: see cuda::scan_ids).

// 8-byte device scratch from the F32 tensors (loom has no 64-bit dtypes): `n` int64_t or doubles.
Tensor scratch_8byte(int64_t n, Device device) { return Tensor::empty(Shape{2 * std::max<int64_t>(n, 1)}, DType::F32, device); }

void check_targets_on_device(const char* op, const cuda::Context& cu, const Tensor& targets, int64_t V,
                             int32_t ignore_index) {
  const cuda::IdScan scan = cuda::scan_ids(cu, targets.data<int32_t>(), targets.numel(), V, ignore_index, op);
  LOOM_CHECK(scan.first_bad < 0, op, ": target ", scan.bad_value, " at flat position ", scan.first_bad,
             " is outside [0, V) with V=", V, " and is not ignore_index=", ignore_index);
}

// The backward of both losses on CUDA: the saved gradients times the upstream (device) scalar.
TensorList scaled_by_upstream(const autograd::BackwardContext& ctx, const char* op, std::initializer_list<Tensor> saved) {
  const Tensor& up = ctx.grad_output(0);
  TensorList out;
  for (const Tensor& t : saved) {
    if (t.defined()) {
      const Device device = dispatch_device(op, {&up, &t});  // the upstream scalar is read on t's device
      cuda::scale_by(cuda_context(op, device), t.data<float>(), up.data<float>(), t.numel());
    }
    out.push_back(t);
  }
  return out;
}

// linear_cross_entropy on CUDA: the CPU's chunk loop with cuBLASLt GEMMs, the gradient written over the
// chunk's logits in place, and dx/dw/loss left on the device. Arguments are already validated.
Tensor linear_cross_entropy_cuda(const Tensor& x, const Tensor& w, const Tensor& targets, int32_t ignore_index,
                                 MatmulPrecision precision, int64_t chunk_rows, const Tensor& w_bf16) {
  const char* op = "linear_cross_entropy";
  const Device device = x.device();
  const cuda::Context& cu = cuda_context(op, device);
  const int64_t C = x.size(-1), V = w.size(0), N = targets.numel();
  check_targets_on_device(op, cu, targets, V, ignore_index);
  const bool need_dx = autograd::any_requires_grad({x}), need_dw = autograd::any_requires_grad({w});
  const bool need_g = need_dx || need_dw;
  const bool use_bf16 = precision == MatmulPrecision::BF16;
  const int64_t R = std::min(chunk_rows, std::max<int64_t>(N, 1));
  Tensor count = scratch_8byte(1, device), row_loss = scratch_8byte(N, device);
  auto* pcount = static_cast<int64_t*>(count.raw_data());
  auto* prow = static_cast<double*>(row_loss.raw_data());
  cuda::count_targets(cu, pcount, targets.data<int32_t>(), N, ignore_index);
  Tensor logits = Tensor::empty({R, V}, DType::F32, device);  // the chunk's logits, then its gradient
  Tensor dx = need_dx ? Tensor::empty(x.shape(), DType::F32, device) : Tensor();
  Tensor dw = need_dw ? Tensor::zeros(w.shape(), DType::F32, device) : Tensor();
  Tensor wb = use_bf16 ? (w_bf16.defined() ? w_bf16 : w.to(DType::BF16)) : Tensor();  // the optimizer's copy
  Tensor xb = use_bf16 ? Tensor::empty({R, C}, DType::BF16, device) : Tensor();
  Tensor gb = use_bf16 && need_g ? Tensor::empty({R, V}, DType::BF16, device) : Tensor();
  const float* px = x.data<float>();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const float* xc = px + r0 * C;
    float* pl = logits.data<float>();
    if (use_bf16) {
      cuda::convert_f32_to_bf16(cu, xb.data<bf16>(), xc, rows * C);
      cuda::gemm_bf16(cu, false, true, rows, V, C, 1.0f, xb.data<bf16>(), C, wb.data<bf16>(), C, 0.0f, pl, V);
    } else {
      cuda::gemm(cu, false, true, rows, V, C, 1.0f, xc, C, w.data<float>(), C, 0.0f, pl, V);
    }
    cuda::cross_entropy_rows(cu, prow + r0, need_g ? pl : nullptr, pl, targets.data<int32_t>() + r0, rows, V,
                             ignore_index, pcount);
    if (!need_g) continue;
    if (use_bf16) {
      cuda::convert_f32_to_bf16(cu, gb.data<bf16>(), pl, rows * V);
      if (need_dx)
        cuda::gemm_bf16(cu, false, false, rows, C, V, 1.0f, gb.data<bf16>(), V, wb.data<bf16>(), C, 0.0f,
                        dx.data<float>() + r0 * C, C);
      if (need_dw)
        cuda::gemm_bf16(cu, true, false, V, C, rows, 1.0f, gb.data<bf16>(), V, xb.data<bf16>(), C, 1.0f,
                        dw.data<float>(), C);
    } else {
      if (need_dx)
        cuda::gemm(cu, false, false, rows, C, V, 1.0f, pl, V, w.data<float>(), C, 0.0f, dx.data<float>() + r0 * C, C);
      if (need_dw) cuda::gemm(cu, true, false, V, C, rows, 1.0f, pl, V, xc, C, 1.0f, dw.data<float>(), C);
    }
  }
  Tensor loss = Tensor::empty(Shape{}, DType::F32, device);
  cuda::mean_loss(cu, loss.data<float>(), prow, N, pcount);
  autograd::record(op, {x, w, targets}, {loss}, [dx, dw](const autograd::BackwardContext& ctx) {
    TensorList g = scaled_by_upstream(ctx, "linear_cross_entropy backward", {dx, dw});
    return TensorList{g[0], g[1], Tensor()};
  });
  return loss;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  LOOM_CHECK(logits.defined() && targets.defined(), "cross_entropy: logits and targets must be defined");
  check_dtype(logits, DType::F32, "cross_entropy", "logits");
  check_dtype(targets, DType::I32, "cross_entropy", "targets");
  LOOM_CHECK(logits.ndim() >= 1, "cross_entropy: logits must have a class dimension, got ", logits.describe());
  LOOM_CHECK(targets.shape() == logits.shape().drop_last(), "cross_entropy: targets have shape ",
             targets.shape(), " but logits ", logits.shape(), " need targets of shape ", logits.shape().drop_last());
  check_same_device(logits, targets, "cross_entropy");
  const Device device = dispatch_device("cross_entropy", {&logits, &targets});
  const int64_t V = logits.size(-1);
  const int64_t N = targets.numel();
  LOOM_CHECK(V > 0, "cross_entropy: logits have V=0 classes");
  if (device.is_cuda()) {
    const cuda::Context& cu = cuda_context("cross_entropy", device);
    check_targets_on_device("cross_entropy", cu, targets, V, ignore_index);
    const bool recording = autograd::any_requires_grad({logits});
    Tensor count = scratch_8byte(1, device), row_loss = scratch_8byte(N, device);
    auto* pcount = static_cast<int64_t*>(count.raw_data());
    Tensor grad = recording ? Tensor::empty(logits.shape(), DType::F32, device) : Tensor();
    cuda::count_targets(cu, pcount, targets.data<int32_t>(), N, ignore_index);
    cuda::cross_entropy_rows(cu, static_cast<double*>(row_loss.raw_data()), recording ? grad.data<float>() : nullptr,
                             logits.data<float>(), targets.data<int32_t>(), N, V, ignore_index, pcount);
    Tensor loss = Tensor::empty(Shape{}, DType::F32, device);
    cuda::mean_loss(cu, loss.data<float>(), static_cast<const double*>(row_loss.raw_data()), N, pcount);
    autograd::record("cross_entropy", {logits, targets}, {loss}, [grad](const autograd::BackwardContext& ctx) {
      if (!ctx.needs_input_grad(0)) return TensorList{Tensor(), Tensor()};
      return TensorList{scaled_by_upstream(ctx, "cross_entropy backward", {grad})[0], Tensor()};
    });
    return loss;
  }

  const int32_t* pt = targets.data<int32_t>();
  const int64_t count = checked_target_count("cross_entropy", targets, V, ignore_index);

  const bool recording = autograd::any_requires_grad({logits});
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  Tensor grad = recording ? Tensor::empty(logits.shape(), DType::F32, logits.device()) : Tensor();
  const double total = cpu::cross_entropy_forward(logits.data<float>(), pt, N, V, ignore_index,
                                                  recording ? grad.data<float>() : nullptr, scale);
  Tensor loss = mean_loss(total, count, logits.device());

  autograd::record("cross_entropy", {logits, targets}, {loss}, [grad](const autograd::BackwardContext& ctx) {
    if (!ctx.needs_input_grad(0)) return TensorList{Tensor(), Tensor()};
    const float upstream = ctx.grad_output(0).item();
    if (upstream != 1.0f) cpu::scale_inplace(grad.data<float>(), upstream, grad.numel());
    return TensorList{grad, Tensor()};
  });
  return loss;
}

namespace {

// Rows whose target is ignore_index add neither loss nor gradient, yet each would cost a row of the head's
// GEMMs over the vocabulary: in SFT they are the prompt, most of a chat row. When there are any, the kept rows
// are gathered (x's rows [count, C] and their targets) and only they meet the vocabulary; dx's other rows are
// zeros (scatter_kept). Every kept row's logits, loss and gradient are the same formulas as without the
// gather; pretraining, with no ignored target, takes the unchanged path over x itself.
struct KeptRows {
  Tensor x;                      // [count, C], x's dtype
  std::vector<int32_t> targets;  // [count]
  std::vector<int64_t> rows;     // [count], their rows in x
};

KeptRows gather_kept(const Tensor& x, const int32_t* pt, int64_t N, int64_t count, int32_t ignore_index) {
  KeptRows k;
  const int64_t C = x.size(-1);
  k.rows.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < N; ++i) {
    if (pt[i] != ignore_index) k.rows.push_back(i);
  }
  k.x = Tensor::empty({count, C}, x.dtype());
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw_data());
  auto* dst = static_cast<uint8_t*>(k.x.raw_data());
  k.targets.reserve(k.rows.size());
  for (size_t r = 0; r < k.rows.size(); ++r) {
    std::memcpy(dst + r * row_bytes, src + static_cast<size_t>(k.rows[r]) * row_bytes, row_bytes);
    k.targets.push_back(pt[k.rows[r]]);
  }
  return k;
}

// The kept rows' f32 gradients dk [count, C] back in their places of a zero [shape].
Tensor scatter_kept(const Tensor& dk, const std::vector<int64_t>& rows, const Shape& shape) {
  Tensor full = Tensor::zeros(shape);
  const int64_t C = shape.back();
  float* pf = full.data<float>();
  const float* pk = dk.data<float>();
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(pf + rows[r] * C, pk + static_cast<int64_t>(r) * C, static_cast<size_t>(C) * sizeof(float));
  return full;
}

}  // namespace

// ---- linear_cross_entropy ------------------------------------------------------------------------
//
// Per chunk of R rows (x_c [R, C], targets_c [R]):
//   logits_c = x_c w^T                       [R, V]   GEMM
//   loss    += sum_rows CE(logits_c)                   fused kernel, also g_c = (softmax - onehot) / count
//   dx_c     = g_c w                         [R, C]   GEMM
//   dw      += g_c^T x_c                     [V, C]   GEMM, accumulating (beta = 1 after the first chunk)
// With bf16 precision the GEMM operands are bf16: w's copy (the caller's w_bf16, else converted once),
// x_c (x itself when it comes as bf16, else converted per chunk) and g_c (converted per chunk).
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int32_t ignore_index,
                            MatmulPrecision precision, int64_t chunk_rows, const Tensor& w_bf16) {
  const char* op = "linear_cross_entropy";
  LOOM_CHECK(x.defined() && w.defined() && targets.defined(), op, ": x, w and targets must be defined");
  const bool use_bf16 = precision == MatmulPrecision::BF16;
  if (!(use_bf16 && x.dtype() == DType::BF16)) check_dtype(x, DType::F32, op, "x");
  check_dtype(w, DType::F32, op, "w");
  if (w_bf16.defined()) {
    LOOM_CHECK(use_bf16 && w_bf16.dtype() == DType::BF16 && w_bf16.shape() == w.shape(), op, ": w_bf16 is ",
               w_bf16.describe(), " but w is ", w.describe(), " (it must be w's bf16 copy, under bf16 precision)");
    LOOM_CHECK(w_bf16.device() == w.device(), op, ": w_bf16 is on ", w_bf16.device(), " but w on ", w.device());
  }
  check_dtype(targets, DType::I32, op, "targets");
  const Device device = dispatch_device(op, {&x, &w, &targets});
  LOOM_CHECK(x.ndim() >= 1 && w.ndim() == 2, op, ": x must be [..., C] and w [V, C], got x ", x.shape(), ", w ",
             w.shape());
  const int64_t C = x.size(-1), V = w.size(0), N = targets.numel();
  LOOM_CHECK(w.size(1) == C, op, ": w ", w.shape(), " does not match the width C=", C, " of x ", x.shape());
  LOOM_CHECK(targets.shape() == x.shape().drop_last(), op, ": targets have shape ", targets.shape(), " but x ",
             x.shape(), " needs targets of shape ", x.shape().drop_last());
  LOOM_CHECK(V > 0, op, ": w has V=0 rows");
  LOOM_CHECK(chunk_rows > 0, op, ": chunk_rows must be positive, got ", chunk_rows);

  if (device.is_cuda()) return linear_cross_entropy_cuda(x, w, targets, ignore_index, precision, chunk_rows, w_bf16);

  const int32_t* pt = targets.data<int32_t>();
  const int64_t count = checked_target_count(op, targets, V, ignore_index);
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;

  const bool need_dx = autograd::any_requires_grad({x}), need_dw = autograd::any_requires_grad({w});
  const bool gather = count < N;  // see gather_kept
  KeptRows kept = gather ? gather_kept(x, pt, N, count, ignore_index) : KeptRows{};
  const Tensor& xk = gather ? kept.x : x;
  if (gather) pt = kept.targets.data();
  const int64_t NK = gather ? count : N;  // the rows that meet the vocabulary
  const int64_t R = std::min(chunk_rows, std::max<int64_t>(NK, 1));
  Tensor logits = Tensor::empty({R, V}), g = (need_dx || need_dw) ? Tensor::empty({R, V}) : Tensor();
  Tensor dx = need_dx ? Tensor::empty(xk.shape()) : Tensor();
  // The first chunk writes dw with beta = 0; zeros only when there is no chunk at all.
  Tensor dw = need_dw ? (NK > 0 ? Tensor::empty(w.shape()) : Tensor::zeros(w.shape())) : Tensor();
  const bool x_is_bf16 = x.dtype() == DType::BF16;
  Tensor wb = use_bf16 ? (w_bf16.defined() ? w_bf16 : w.to(DType::BF16)) : Tensor();
  Tensor xb = use_bf16 && !x_is_bf16 ? Tensor::empty({R, C}, DType::BF16) : Tensor();
  Tensor gb = use_bf16 && g.defined() ? Tensor::empty({R, V}, DType::BF16) : Tensor();
  const float* px = x_is_bf16 ? nullptr : xk.data<float>();
  double total = 0;
  for (int64_t r0 = 0; r0 < NK; r0 += R) {
    const int64_t rows = std::min(R, NK - r0);
    const float* xc = x_is_bf16 ? nullptr : px + r0 * C;
    const bf16* xbc = nullptr;  // x_c in bf16
    if (use_bf16) {
      if (x_is_bf16) {
        xbc = xk.data<bf16>() + r0 * C;
      } else {
        cpu::convert_f32_to_bf16(xc, xb.data<bf16>(), rows * C);
        xbc = xb.data<bf16>();
      }
      cpu::gemm_bf16(false, true, rows, V, C, 1.0f, xbc, C, wb.data<bf16>(), C, 0.0f, logits.data<float>(), V);
    } else {
      cpu::gemm(false, true, rows, V, C, 1.0f, xc, C, w.data<float>(), C, 0.0f, logits.data<float>(), V);
    }
    total += cpu::cross_entropy_forward(logits.data<float>(), pt + r0, rows, V, ignore_index,
                                        g.defined() ? g.data<float>() : nullptr, scale);
    if (!g.defined()) continue;
    const float beta = r0 == 0 ? 0.0f : 1.0f;
    if (use_bf16) {
      cpu::convert_f32_to_bf16(g.data<float>(), gb.data<bf16>(), rows * V);
      if (need_dx)
        cpu::gemm_bf16(false, false, rows, C, V, 1.0f, gb.data<bf16>(), V, wb.data<bf16>(), C, 0.0f,
                       dx.data<float>() + r0 * C, C);
      if (need_dw)
        cpu::gemm_bf16(true, false, V, C, rows, 1.0f, gb.data<bf16>(), V, xbc, C, beta, dw.data<float>(), C);
    } else {
      if (need_dx)
        cpu::gemm(false, false, rows, C, V, 1.0f, g.data<float>(), V, w.data<float>(), C, 0.0f,
                  dx.data<float>() + r0 * C, C);
      if (need_dw) cpu::gemm(true, false, V, C, rows, 1.0f, g.data<float>(), V, xc, C, beta, dw.data<float>(), C);
    }
  }
  Tensor loss = mean_loss(total, count, x.device());
  if (need_dx && gather) dx = scatter_kept(dx, kept.rows, x.shape());

  autograd::record(op, {x, w, targets}, {loss}, [dx, dw](const autograd::BackwardContext& ctx) {
    const float upstream = ctx.grad_output(0).item();
    for (const Tensor& t : {dx, dw}) {
      if (t.defined() && upstream != 1.0f) cpu::scale_inplace(t.data<float>(), upstream, t.numel());
    }
    return TensorList{dx, dw, Tensor()};
  });
  return loss;
}

Tensor dequantized_linear_cross_entropy(const Tensor& x, std::shared_ptr<const quant::QuantizedMatrix> w,
                                        const Tensor& targets, int32_t ignore_index) {
  const char* op = "dequantized_linear_cross_entropy";
  LOOM_CHECK(w != nullptr, op, ": no quantized weight");
  LOOM_CHECK(x.defined() && x.dtype() == DType::F32 && x.device().is_cpu() && x.ndim() >= 1, op,
             ": a quantized head multiplies f32 CPU activations [..., C], got ", x.defined() ? x.describe() : "undefined");
  LOOM_CHECK(targets.defined(), op, ": targets must be defined");
  check_dtype(targets, DType::I32, op, "targets");
  const int64_t C = x.size(-1), V = w->rows(), N = targets.numel();
  LOOM_CHECK(w->cols() == C, op, ": x has C=", C, " but the quantized weight is [", V, ", ", w->cols(), "]");
  LOOM_CHECK(targets.shape() == x.shape().drop_last(), op, ": targets have shape ", targets.shape(), " but x ",
             x.shape(), " needs targets of shape ", x.shape().drop_last());
  LOOM_CHECK(V > 0, op, ": w has V=0 rows");
  const int32_t* pt = targets.data<int32_t>();
  const int64_t count = checked_target_count(op, targets, V, ignore_index);
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  const bool need_dx = autograd::any_requires_grad({x});
  const bool gather = count < N;  // see gather_kept
  KeptRows kept = gather ? gather_kept(x, pt, N, count, ignore_index) : KeptRows{};
  const Tensor& xk = gather ? kept.x : x;
  if (gather) pt = kept.targets.data();
  const int64_t NK = gather ? count : N;  // the rows that meet the vocabulary
  const float* px = xk.data<float>();
  constexpr int64_t kTile = 256;  // vocabulary rows dequantized at once (as dequantized_linear's tiles)
  const int64_t width = std::min(kTile, V);
  std::vector<float> tile(static_cast<size_t>(width * C)), logits(static_cast<size_t>(std::max<int64_t>(NK, 1) * width));
  // Row r's running max m, sum of exp(logit - m), and its target's logit.
  std::vector<float> m(static_cast<size_t>(NK), -std::numeric_limits<float>::infinity());
  std::vector<double> s(static_cast<size_t>(NK), 0.0);
  std::vector<float> target_logit(static_cast<size_t>(NK), 0.0f);
  auto tile_logits = [&](int64_t n0, int64_t n) {  // logits[NK, n] = x[NK, C] @ w[n0:n0+n]^T
    w->dequantize_rows(n0, n, tile.data());
    cpu::gemm(false, true, NK, n, C, 1.0f, px, C, tile.data(), C, 0.0f, logits.data(), n);
  };
  for (int64_t n0 = 0; NK > 0 && n0 < V; n0 += kTile) {
    const int64_t n = std::min(kTile, V - n0);
    tile_logits(n0, n);
    parallel_for(0, NK, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int32_t t = pt[r];
        if (t == ignore_index) continue;
        const float* row = logits.data() + r * n;
        float mt = row[0];
        for (int64_t j = 1; j < n; ++j) mt = std::max(mt, row[j]);
        const float mn = std::max(m[static_cast<size_t>(r)], mt);
        double sum = s[static_cast<size_t>(r)] * std::exp(static_cast<double>(m[static_cast<size_t>(r)] - mn));
        for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(row[j] - mn));
        s[static_cast<size_t>(r)] = sum;
        m[static_cast<size_t>(r)] = mn;
        if (t >= n0 && t < n0 + n) target_logit[static_cast<size_t>(r)] = row[t - n0];
      }
    });
  }
  double total = 0;
  std::vector<float> lse(static_cast<size_t>(NK), 0.0f);
  for (int64_t r = 0; r < NK; ++r) {
    if (pt[r] == ignore_index) continue;
    const double l = static_cast<double>(m[static_cast<size_t>(r)]) + std::log(s[static_cast<size_t>(r)]);
    lse[static_cast<size_t>(r)] = static_cast<float>(l);
    total += l - static_cast<double>(target_logit[static_cast<size_t>(r)]);
  }
  Tensor dx;
  if (need_dx) {
    dx = NK > 0 ? Tensor::empty(xk.shape()) : Tensor::zeros(xk.shape());
    for (int64_t n0 = 0; NK > 0 && n0 < V; n0 += kTile) {
      const int64_t n = std::min(kTile, V - n0);
      tile_logits(n0, n);
      parallel_for(0, NK, 16, [&](int64_t r0, int64_t r1) {  // the tile's g = (softmax - onehot) / count, in place
        for (int64_t r = r0; r < r1; ++r) {
          float* row = logits.data() + r * n;
          const int32_t t = pt[r];
          if (t == ignore_index) {
            std::fill(row, row + n, 0.0f);
            continue;
          }
          const float l = lse[static_cast<size_t>(r)];
          for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - l) * scale;
          if (t >= n0 && t < n0 + n) row[t - n0] -= scale;
        }
      });
      // dx[NK, C] (+)= g[NK, n] @ w[n0:n0+n]
      cpu::gemm(false, false, NK, C, n, 1.0f, logits.data(), n, tile.data(), C, n0 == 0 ? 0.0f : 1.0f, dx.data<float>(), C);
    }
  }
  Tensor loss = mean_loss(total, count, x.device());
  if (need_dx && gather) dx = scatter_kept(dx, kept.rows, x.shape());
  autograd::record(op, {x, targets}, {loss}, [dx](const autograd::BackwardContext& ctx) {
    const float upstream = ctx.grad_output(0).item();
    if (dx.defined() && upstream != 1.0f) cpu::scale_inplace(dx.data<float>(), upstream, dx.numel());
    return TensorList{dx, Tensor()};
  });
  return loss;
}

}  // namespace loom::ops
