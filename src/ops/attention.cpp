// Attention ops: validation, dispatch to the CPU kernels, and the recorded backward.
//
//   scaled_dot_product_attention: no mask -> flash kernels (causal or not); a mask -> the naive masked
//     kernels (the mask is already Tq x Tk, so materialising the scores costs no extra order of memory).
//   causal_self_attention: flash kernels reading heads in place from [B, T, H*D] (row stride H*D),
//     with RoPE fused into the packing of q and k, and dropout on the probabilities fused too.
#include "ops/attention.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "backends/backend.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/rope.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/rope.h"
#include "core/autograd.h"
#include "core/parallel.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "ops/shape.h"
#include "ops/softmax.h"

namespace loom::ops {
namespace {

void check_float(const Tensor& t, const char* op, const char* arg) {
  LOOM_CHECK(t.defined(), op, ": ", arg, " is undefined");
  check_dtype(t, DType::F32, op, arg);
}

// RoPE tables for causal_self_attention, kept alive by the backward closure.
struct RopeState {
  Tensor cos, sin;  // [P, D/2]
  RopeTables tables() const;
  int64_t batch_stride = 0;
  bool interleaved = true;
};

void check_dropout(const AttentionDropout& dropout, const char* op) {
  LOOM_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, op, ": attention dropout p must be in [0, 1), got p=",
             dropout.p);
}

RopeTables RopeState::tables() const {
  RopeTables t;
  if (cos.defined()) {
    t.cos = cos.data<float>();
    t.sin = sin.data<float>();
    t.batch_stride = batch_stride;
    t.interleaved = interleaved;
  }
  return t;
}

// causal_self_attention on CUDA (arguments validated, p filled in without RoPE): RoPE is not fused into
// the CUDA kernels, so q and k are rotated into new tensors first (cuda::rope_apply over [B*T, H, D]), and
// the backward rotates dq and dk back (RoPE's transpose) in place.
Tensor causal_self_attention_cuda(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const RopeState& rope, int num_heads, int num_kv_heads) {
  const char* op = "causal_self_attention";
  const Device device = q.device();
  const cuda::Context& cu = cuda_context(op, device);
  const int64_t b = q.size(0), t = q.size(1), d = p.d;
  const bool has_rope = rope.cos.defined();
  Tensor cos, sin;
  if (has_rope) {
    cos = rope.cos.to(device);
    sin = rope.sin.to(device);
  }
  const bool per_row = rope.batch_stride != 0, interleaved = rope.interleaved;
  // Row r = b*T + t of [B*T, H, D] has position row r ([B, T] positions) or r % T (shared [T]).
  auto rotate = [cos, sin, b, t, d, per_row, interleaved](const cuda::Context& c, Tensor& dst, const Tensor& src,
                                                          int heads, bool inverse) {
    cuda::rope_apply(c, dst.data<float>(), src.data<float>(), cos.data<float>(), sin.data<float>(), b * t, t, d,
                     per_row, interleaved, inverse, heads);
  };
  Tensor qr = q.detach(), kr = k.detach();
  if (has_rope) {
    qr = Tensor::empty(q.shape(), DType::F32, device);
    kr = Tensor::empty(k.shape(), DType::F32, device);
    rotate(cu, qr, q, num_heads, false);
    rotate(cu, kr, k, num_kv_heads, false);
  }
  Tensor out = Tensor::empty(q.shape(), DType::F32, device);
  Tensor lse = Tensor::empty({b * num_heads, t}, DType::F32, device);
  cuda::flash_attention_forward(cu, p, qr.data<float>(), kr.data<float>(), v.data<float>(), out.data<float>(),
                                lse.data<float>());
  autograd::record(op, {q, k, v}, {out},
                   [p, qr, kr, v = v.detach(), saved_out = out.detach(), lse, rotate, has_rope, num_heads,
                    num_kv_heads](const autograd::BackwardContext& ctx) {
                     const Tensor& dout = ctx.grad_output(0);
                     const Device device = dispatch_device("causal_self_attention backward", {&dout, &qr});
                     Tensor dq = Tensor::empty(qr.shape(), DType::F32, device);
                     Tensor dk = Tensor::empty(kr.shape(), DType::F32, device);
                     Tensor dv = Tensor::empty(v.shape(), DType::F32, device);
                     const cuda::Context& cu = cuda_context("causal_self_attention backward", device);
                     cuda::flash_attention_backward(cu, p,
                                                    qr.data<float>(), kr.data<float>(), v.data<float>(),
                                                    saved_out.data<float>(), dout.data<float>(), lse.data<float>(),
                                                    dq.data<float>(), dk.data<float>(), dv.data<float>());
                     if (has_rope) {
                       rotate(cu, dq, dq, num_heads, true);
                       rotate(cu, dk, dk, num_kv_heads, true);
                     }
                     return TensorList{dq, dk, dv};
                   });
  return out;
}

}  // namespace

namespace {
void check_key_begin(const Tensor& key_begin, int64_t b, int64_t t, const char* op);
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    bool causal, std::optional<float> scale, MatmulPrecision precision,
                                    const Tensor& key_begin) {
  const char* op = "scaled_dot_product_attention";
  check_float(q, op, "q");
  check_float(k, op, "k");
  check_float(v, op, "v");
  // Without a mask the flash kernels run on CUDA too; the masked (naive) kernels are CPU only.
  const Device device = dispatch_device(op, {&q, &k, &v});
  if (mask.defined()) require_cpu(op, {&q, &k, &v, &mask});
  LOOM_CHECK(q.ndim() >= 2 && k.ndim() == q.ndim() && v.ndim() == q.ndim(), op,
             ": q, k, v must be [..., T, D] with the same rank, got q ", q.shape(), ", k ", k.shape(), ", v ",
             v.shape());
  const Shape lead = q.shape().drop_last(2);
  const Shape kv_lead = k.shape().drop_last(2);
  // Grouped-query attention: k and v may have fewer heads (the last leading dimension) than q, as long
  // as the count divides q's; query head h then reads k/v head h / (Hq / Hkv).
  const bool grouped = kv_lead != lead && lead.size() >= 1 && kv_lead.size() == lead.size() &&
                       kv_lead.drop_last(1) == lead.drop_last(1) && kv_lead[kv_lead.size() - 1] > 0 &&
                       lead[lead.size() - 1] > 0 &&  // 0 heads over 1: 0 % 1 == 0, then 0 / 0 (SIGFPE)
                       lead[lead.size() - 1] % kv_lead[kv_lead.size() - 1] == 0;
  LOOM_CHECK((kv_lead == lead || grouped) && v.shape().drop_last(2) == kv_lead, op,
             ": leading dimensions differ: q ", q.shape(), ", k ", k.shape(), ", v ", v.shape(),
             " (k and v may only have fewer heads than q, a divisor of q's, in the last leading dimension)");
  const int64_t tq = q.size(-2), d = q.size(-1), tk = k.size(-2), dv = v.size(-1);
  LOOM_CHECK(k.size(-1) == d, op, ": q has D=", d, " but k has D=", k.size(-1), " (q ", q.shape(), ", k ",
             k.shape(), ")");
  LOOM_CHECK(v.size(-2) == tk, op, ": k has Tk=", tk, " but v has ", v.size(-2), " rows (k ", k.shape(), ", v ",
             v.shape(), ")");
  LOOM_CHECK(d > 0, op, ": head dimension D must be positive, got q ", q.shape());
  int64_t mask_head_stride = 0;
  if (mask.defined()) {
    check_dtype(mask, DType::Bool, op, "mask");
    Shape full = lead;
    full.push_back(tq);
    full.push_back(tk);
    const bool shared = mask.shape() == Shape{tq, tk};
    LOOM_CHECK(shared || mask.shape() == full, op, ": mask has shape ", mask.shape(), " but needs [", tq, ", ",
               tk, "] or ", full);
    mask_head_stride = shared ? 0 : tq * tk;
  }
  const float s = scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
  LOOM_CHECK(std::isfinite(s), op, ": scale must be finite, got ", s);

  const int64_t heads = lead.numel();
  AttentionProblem p;
  p.batches = heads;
  p.tq = tq;
  p.tk = tk;
  p.d = d;
  p.dv = dv;
  p.scale = s;
  p.causal = causal;
  p.bf16_products = precision == MatmulPrecision::BF16;
  p.q = {tq * d, 0, d};
  p.k = {tk * d, 0, d};
  p.v = {tk * dv, 0, dv};
  p.out = {tq * dv, 0, dv};
  // `batches` entries of hq query heads over hkv k/v heads each: [..., Hq, T, D] over [..., Hkv, T, D].
  const auto set_head_groups = [&](int64_t batches, int64_t hq, int64_t hkv) {
    p.batches = batches;
    p.heads_per_batch = hq;
    p.kv_group = hq / hkv;
    p.q = {hq * tq * d, tq * d, d};
    p.k = {hkv * tk * d, tk * d, d};
    p.v = {hkv * tk * dv, tk * dv, dv};
    p.out = {hq * tq * dv, tq * dv, dv};
  };
  if (grouped) {
    const int64_t hq = lead[lead.size() - 1];
    set_head_groups(heads / hq, hq, kv_lead[kv_lead.size() - 1]);
  }
  if (key_begin.defined()) {
    // Document masking reads key_begin by batch entry: [B, H, T, D] as B entries of H heads each.
    LOOM_CHECK(q.ndim() == 4 && causal && !mask.defined() && tq == tk && !device.is_cuda(), op,
               ": key_begin (document masking) needs q, k, v [B, H, T, D] on the CPU, causal and without a mask; got q ",
               q.describe(), ", causal ", causal, ", mask ", mask.defined() ? mask.describe() : "none");
    check_key_begin(key_begin, q.size(0), tq, op);
    set_head_groups(q.size(0), q.size(1), k.size(1));
    p.key_begin = key_begin.data<int32_t>();
  }

  Shape out_shape = lead;
  out_shape.push_back(tq);
  out_shape.push_back(dv);
  Tensor out = Tensor::empty(out_shape, DType::F32, q.device());
  Tensor lse = Tensor::empty({heads, tq}, DType::F32, q.device());
  if (device.is_cuda()) {
    cuda::flash_attention_forward(cuda_context(op, device), p, q.data<float>(), k.data<float>(), v.data<float>(),
                                  out.data<float>(), lse.data<float>());
  } else if (mask.defined()) {
    cpu::masked_attention_forward(p, mask.data<bool>(), mask_head_stride, q.data<float>(), k.data<float>(),
                                  v.data<float>(), out.data<float>(), lse.data<float>());
  } else {
    cpu::flash_attention_forward(p, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                 lse.data<float>());
  }
  autograd::record(op, {q, k, v}, {out},
                   [p, q = q.detach(), k = k.detach(), v = v.detach(), saved_out = out.detach(), lse, mask,
                    mask_head_stride, key_begin](const autograd::BackwardContext& ctx) {
                     const Tensor& dout = ctx.grad_output(0);
                     const Device device = dispatch_device("scaled_dot_product_attention backward", {&dout, &q});
                     Tensor dq = Tensor::empty(q.shape(), DType::F32, device);
                     Tensor dk = Tensor::empty(k.shape(), DType::F32, device);
                     Tensor dv = Tensor::empty(v.shape(), DType::F32, device);
                     if (device.is_cuda()) {
                       cuda::flash_attention_backward(
                           cuda_context("scaled_dot_product_attention backward", device), p, q.data<float>(),
                           k.data<float>(), v.data<float>(), saved_out.data<float>(), dout.data<float>(),
                           lse.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>());
                     } else if (mask.defined()) {
                       cpu::masked_attention_backward(p, mask.data<bool>(), mask_head_stride, q.data<float>(),
                                                      k.data<float>(), v.data<float>(), dout.data<float>(),
                                                      lse.data<float>(), dq.data<float>(), dk.data<float>(),
                                                      dv.data<float>());
                     } else {
                       cpu::flash_attention_backward(p, q.data<float>(), k.data<float>(), v.data<float>(),
                                                     saved_out.data<float>(), dout.data<float>(), lse.data<float>(),
                                                     dq.data<float>(), dk.data<float>(), dv.data<float>());
                     }
                     return TensorList{dq, dk, dv};
                   });
  return out;
}

namespace {
// key_begin of causal_self_attention: i32 [B, T] with 0 <= key_begin[b, t] <= t (on the CPU).
void check_key_begin(const Tensor& key_begin, int64_t b, int64_t t, const char* op) {
  check_dtype(key_begin, DType::I32, op, "key_begin");
  LOOM_CHECK(key_begin.device().is_cpu(), op, ": key_begin (document masking) is CPU only, got ",
             key_begin.describe());
  LOOM_CHECK(key_begin.shape() == (Shape{b, t}), op, ": key_begin has shape ", key_begin.shape(), " but needs [",
             b, ", ", t, "]");
  const int32_t* kb = key_begin.data<int32_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i)
      LOOM_CHECK(kb[r * t + i] >= 0 && kb[r * t + i] <= i, op, ": key_begin[", r, ", ", i, "] = ", kb[r * t + i],
                 " is not in [0, ", i, "] (a position's document starts at or before it)");
}
}  // namespace

Tensor causal_self_attention(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                             const std::optional<RopeOptions>& rope, int num_kv_heads,
                             const AttentionDropout& dropout, MatmulPrecision precision, const Tensor& key_begin) {
  const char* op = "causal_self_attention";
  check_float(q, op, "q");
  check_float(k, op, "k");
  check_float(v, op, "v");
  const Device device = dispatch_device(op, {&q, &k, &v});
  check_dropout(dropout, op);
  LOOM_CHECK(q.ndim() == 3, op, ": q must be [B, T, H*D], got ", q.shape());
  const int64_t b = q.size(0), t = q.size(1), c = q.size(2);
  LOOM_CHECK(num_heads > 0 && c % num_heads == 0, op, ": num_heads=", num_heads, " does not divide the width ",
             c, " of q ", q.shape());
  const int64_t d = c / num_heads;
  LOOM_CHECK(d > 0, op, ": head dimension is 0 for q ", q.shape());
  if (num_kv_heads == 0) num_kv_heads = num_heads;
  LOOM_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, op, ": num_kv_heads=", num_kv_heads,
             " must be positive and divide num_heads=", num_heads);
  const int64_t ckv = num_kv_heads * d;  // width of k and v
  LOOM_CHECK(k.shape() == (Shape{b, t, ckv}) && v.shape() == (Shape{b, t, ckv}), op, ": k and v must be [", b,
             ", ", t, ", ", ckv, "] (", num_kv_heads, " k/v heads of ", d, "), got k ", k.shape(), ", v ",
             v.shape(), " for q ", q.shape());

  auto state = std::make_shared<RopeState>();
  if (rope.has_value()) {
    const Tensor& pos = rope->positions;
    LOOM_CHECK(pos.defined(), op, ": rope positions are undefined");
    check_dtype(pos, DType::I32, op, "rope.positions");
    LOOM_CHECK(d % 2 == 0, op, ": RoPE needs an even head dimension, got D=", d, " (width ", c, " / num_heads=",
               num_heads, ")");
    LOOM_CHECK(rope->theta > 0.0f, op, ": rope theta must be positive, got ", rope->theta);
    const bool shared = pos.shape() == Shape{t};
    const bool per_batch = pos.shape() == Shape{b, t};
    LOOM_CHECK(shared || per_batch, op, ": rope positions have shape ", pos.shape(),
               " but need [", t, "] or [", b, ", ", t, "]");
    std::tie(state->cos, state->sin) =
        rope_tables(pos.device().is_cpu() ? pos : pos.to(Device::cpu()), d, rope->theta, rope->cache);
    state->batch_stride = shared ? 0 : t;
    state->interleaved = rope->style == RopeStyle::Interleaved;
  }

  AttentionProblem p;
  p.batches = b;
  p.heads_per_batch = num_heads;
  p.tq = p.tk = t;
  p.d = p.dv = d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.causal = true;
  p.kv_group = num_heads / num_kv_heads;
  p.q = p.out = {t * c, d, c};
  p.k = p.v = {t * ckv, d, ckv};
  p.dropout_p = dropout.p;
  p.dropout_key = dropout.key;
  p.bf16_products = precision == MatmulPrecision::BF16;

  if (key_begin.defined()) {
    LOOM_CHECK(!device.is_cuda(), op, ": document masking (key_begin) runs on the CPU only, got q on ",
               q.describe());
    check_key_begin(key_begin, b, t, op);
    p.key_begin = key_begin.data<int32_t>();
  }
  if (device.is_cuda()) return causal_self_attention_cuda(p, q, k, v, *state, num_heads, num_kv_heads);

  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  Tensor lse = Tensor::empty({b * num_heads, t}, DType::F32, q.device());
  p.rope = state->tables();
  cpu::flash_attention_forward(p, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                               lse.data<float>());
  autograd::record(op, {q, k, v}, {out},
                   [p, state, q = q.detach(), k = k.detach(), v = v.detach(), saved_out = out.detach(),
                    lse, key_begin](const autograd::BackwardContext& ctx) {
                     const Tensor& dout = ctx.grad_output(0);
                     Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
                     AttentionProblem pb = p;
                     pb.rope = state->tables();
                     cpu::flash_attention_backward(pb, q.data<float>(), k.data<float>(), v.data<float>(),
                                                   saved_out.data<float>(), dout.data<float>(), lse.data<float>(),
                                                   dq.data<float>(), dk.data<float>(), dv.data<float>());
                     return TensorList{dq, dk, dv};
                   });
  return out;
}

// ---- helpers and the composite reference ----------------------------------------------------------

namespace {

// dst[b, h, t, :] <-> src[b, t, h, :]: the same permutation of the two middle axes either way.
void swap_middle_axes(float* dst, const float* src, int64_t b, int64_t n1, int64_t n2, int64_t d) {
  parallel_for(0, b * n1, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n2 * d)), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const int64_t bi = r / n1, i = r % n1;
      for (int64_t j = 0; j < n2; ++j) {
        const float* from = src + ((bi * n2 + j) * n1 + i) * d;
        std::copy(from, from + d, dst + ((bi * n1 + i) * n2 + j) * d);
      }
    }
  });
}

}  // namespace

Tensor split_heads(const Tensor& x, int num_heads) {
  check_float(x, "split_heads", "x");
  require_cpu("split_heads", {&x});
  LOOM_CHECK(x.ndim() == 3, "split_heads: x must be [B, T, H*D], got ", x.shape());
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  LOOM_CHECK(num_heads > 0 && c % num_heads == 0, "split_heads: num_heads=", num_heads,
             " does not divide the width ", c, " of x ", x.shape());
  const int64_t h = num_heads, d = c / h;
  Tensor out = Tensor::empty({b, h, t, d});
  swap_middle_axes(out.data<float>(), x.data<float>(), b, h, t, d);
  autograd::record("split_heads", {x}, {out}, [](const autograd::BackwardContext& ctx) {
    return TensorList{merge_heads(ctx.grad_output(0))};
  });
  return out;
}

Tensor merge_heads(const Tensor& x) {
  check_float(x, "merge_heads", "x");
  require_cpu("merge_heads", {&x});
  LOOM_CHECK(x.ndim() == 4, "merge_heads: x must be [B, H, T, D], got ", x.shape());
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  Tensor out = Tensor::empty({b, t, h * d});
  swap_middle_axes(out.data<float>(), x.data<float>(), b, t, h, d);
  autograd::record("merge_heads", {x}, {out}, [h](const autograd::BackwardContext& ctx) {
    return TensorList{split_heads(ctx.grad_output(0), static_cast<int>(h))};
  });
  return out;
}

Tensor causal_mask(int64_t t) {
  LOOM_CHECK(t >= 0, "causal_mask: negative length ", t);
  Tensor m = Tensor::empty({t, t}, DType::Bool);
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) p[i * t + j] = j <= i;
  return m;
}

namespace {

// softmax(q k^T * scale, causal) o Z, times v, from basic ops, with Z = keep/(1-p) drawn element by
// element with random_uniform at the counter causal_self_attention documents.
//   qh: [B, H, T, D]; kh, vh: [B, Hkv, T, D]. Returns [B, H, T, D].
Tensor attention_with_dropout(const Tensor& qh, const Tensor& kh, const Tensor& vh, const AttentionDropout& dropout) {
  const int64_t b = qh.size(0), h = qh.size(1), t = qh.size(2), d = qh.size(3), hkv = kh.size(1), g = h / hkv;
  // The query heads of a k/v group are consecutive, so [B, H, T, D] is [B, Hkv, G*T, D] and one batched
  // matmul against [B, Hkv, T, D] serves grouped-query attention without repeating k and v.
  Tensor scores = matmul(reshape(qh, {b, hkv, g * t, d}), kh, false, true);  // [B, Hkv, G*T, T]
  scores = reshape(scale(scores, 1.0f / std::sqrt(static_cast<float>(d))), {b, h, t, t});
  Tensor future = Tensor::zeros({b, h, t, t});  // -inf where key j > query i
  Tensor keep = Tensor::empty({b, h, t, t});     // Z: keep / (1 - p)
  const int64_t t64 = (t + 63) / 64 * 64;
  const float keep_scale = 1.0f / (1.0f - dropout.p);
  for (int64_t n = 0; n < b * h; ++n)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) {
        const int64_t e = (n * t + i) * t + j;
        if (j > i) future.data<float>()[e] = -std::numeric_limits<float>::infinity();
        const uint64_t counter = static_cast<uint64_t>((n * t + i) * t64 + j);  // ((b*H + h)*T + i)*T64 + j
        keep.data<float>()[e] = random_uniform(dropout.key, counter) < dropout.p ? 0.0f : keep_scale;
      }
  Tensor probs = mul(softmax(add(scores, future)), keep);                        // [B, H, T, T]
  Tensor out = matmul(reshape(probs, {b, hkv, g * t, t}), vh);                   // [B, Hkv, G*T, D]
  return reshape(out, {b, h, t, d});
}

}  // namespace

Tensor causal_self_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, int num_heads,
                                       const std::optional<RopeOptions>& rope, int num_kv_heads,
                                       const AttentionDropout& dropout, const Tensor& key_begin) {
  LOOM_CHECK(q.ndim() == 3, "causal_self_attention_reference: q must be [B, T, H*D], got ", q.shape());
  check_dropout(dropout, "causal_self_attention_reference");
  if (num_kv_heads == 0) num_kv_heads = num_heads;
  Tensor qh = split_heads(q, num_heads), kh = split_heads(k, num_kv_heads), vh = split_heads(v, num_kv_heads);
  if (rope.has_value()) {
    // rope takes positions [T] or the full leading shape [B, H, T]: broadcast [B, T] over heads.
    auto over_heads = [&](int heads) {
      Tensor pos = rope->positions;
      const int64_t b = q.size(0), t = q.size(1);
      if (!pos.defined() || pos.shape() != Shape{b, t}) return pos;
      Tensor full = Tensor::empty({b, heads, t}, DType::I32);
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t h = 0; h < heads; ++h)
          std::copy(pos.data<int32_t>() + bi * t, pos.data<int32_t>() + (bi + 1) * t,
                    full.data<int32_t>() + (bi * heads + h) * t);
      return full;
    };
    qh = ops::rope(qh, over_heads(num_heads), rope->theta, rope->style);
    kh = ops::rope(kh, over_heads(num_kv_heads), rope->theta, rope->style);
  }
  if (key_begin.defined()) {
    const int64_t b = q.size(0), t = q.size(1);
    check_key_begin(key_begin, b, t, "causal_self_attention_reference");
    LOOM_CHECK(dropout.p == 0.0f, "causal_self_attention_reference: key_begin takes no dropout");
    // [B, H, T, T]: query i of row r sees keys key_begin[r, i] <= j <= i.
    Tensor mask = Tensor::empty({b, num_heads, t, t}, DType::Bool);
    bool* m = mask.data<bool>();
    const int32_t* kb = key_begin.data<int32_t>();
    for (int64_t r = 0; r < b; ++r)
      for (int64_t h = 0; h < num_heads; ++h)
        for (int64_t i = 0; i < t; ++i)
          for (int64_t j = 0; j < t; ++j) m[((r * num_heads + h) * t + i) * t + j] = j >= kb[r * t + i] && j <= i;
    return merge_heads(scaled_dot_product_attention(qh, kh, vh, mask, /*causal=*/false));
  }
  if (dropout.p > 0.0f) return merge_heads(attention_with_dropout(qh, kh, vh, dropout));
  Tensor o = scaled_dot_product_attention(qh, kh, vh, causal_mask(q.size(1)), /*causal=*/false);
  return merge_heads(o);
}

}  // namespace loom::ops
