// Multi-head latent attention's head layouts (DeepSeek-V2/V3): ops/mla.h.
#include "ops/mla.h"

#include <cstring>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/rope.h"
#include "backends/cuda/mla.h"
#include "core/autograd.h"
#include "core/parallel.h"

namespace loom::ops {
namespace {

// The RoPE table rows of the rotated part (P dims) for positions [T] or [B, T]: row (b, t) of a
// [B, T, ...] activation is table row t, or b * T + t for packed rows' per-row positions.
struct RopeRows {
  Tensor cos, sin;  // [T or B*T, P/2]
  bool per_batch = false;
  int64_t T = 0, half = 0;
  int64_t row(int64_t b, int64_t t) const { return per_batch ? b * T + t : t; }
  const float* cos_of(int64_t b, int64_t t) const { return cos.data<float>() + row(b, t) * half; }
  const float* sin_of(int64_t b, int64_t t) const { return sin.data<float>() + row(b, t) * half; }
};

// The tables are built on the host (positions, a few ints, read there when they are on a GPU) and, for
// a CUDA activation on `device`, copied to it once per call, as ops::rope does.
RopeRows rope_rows(const Tensor& positions, int64_t B, int64_t T, int64_t P, const ops::RopeCache& cache,
                   const char* op, Device device = Device::cpu()) {
  check_dtype(positions, DType::I32, op, "positions");
  const bool per_batch = positions.ndim() == 2;
  LOOM_CHECK((positions.ndim() == 1 && positions.size(0) == T) || (per_batch && positions.shape() == Shape({B, T})), op,
             ": positions ", positions.describe(), " do not fit B=", B, ", T=", T, " (expected [T] or [B, T])");
  LOOM_CHECK(positions.device().is_cpu() || positions.device() == device, op, ": positions are on ",
             positions.device(), " but the activations are on ", device);
  auto [cos, sin] = ops::rope_tables(positions.device().is_cpu() ? positions : positions.to(Device::cpu()), P,
                                     cache.theta, cache);
  if (device.is_cuda()) {
    cos = cos.to(device);
    sin = sin.to(device);
  }
  return RopeRows{cos, sin, per_batch, T, P / 2};
}

}  // namespace

// q: [B, T, H*(N+P)], wq_b's output -> [B, H, T, N+P], each head's last P values rotated (the seed's
// apply_rope on q[..., N:]). One pass each way, where splitting heads, the nope/rope narrows, RoPE and
// their concatenation made four copies forward and, backward, zero-filled gradients and their sums.
// The values are those of the composed ops (the same copies, the same cpu::rope_rotate_row).
Tensor mla_query_heads(const Tensor& q, int64_t H, int64_t N, int64_t P, const Tensor& positions,
                   const ops::RopeCache& cache) {
  const char* op = "mla_query_heads";
  check_dtype(q, DType::F32, op, "q");
  const Device device = dispatch_device(op, {&q});  // before allocating: errors name the op
  const int64_t B = q.size(0), T = q.size(1), D = N + P;
  LOOM_CHECK(q.ndim() == 3 && q.size(2) == H * D, op, ": q ", q.describe(), " is not [B, T, ", H, "*", D, "]");
  const RopeRows rope = rope_rows(positions, B, T, P, cache, op, device);
  if (device.is_cuda()) {
    Tensor out = Tensor::empty({B, H, T, D}, DType::F32, device);
    cuda::mla_query_heads(cuda_context(op, device), q.data<float>(), out.data<float>(), rope.cos.data<float>(),
                          rope.sin.data<float>(), B, T, H, N, P, rope.per_batch, /*backward=*/false);
    autograd::record(op, {q}, {out}, [rope, B, T, H, N, P, shape = q.shape()](const autograd::BackwardContext& ctx) {
      const Tensor& g = ctx.grad_output(0);
      check_dtype(g, DType::F32, "mla_query_heads backward", "grad");
      const Device device = dispatch_device("mla_query_heads backward", {&g, &rope.cos});
      Tensor dq = Tensor::empty(shape, DType::F32, device);
      cuda::mla_query_heads(cuda_context("mla_query_heads backward", device), g.data<float>(), dq.data<float>(),
                            rope.cos.data<float>(), rope.sin.data<float>(), B, T, H, N, P, rope.per_batch,
                            /*backward=*/true);
      return TensorList{dq};
    });
    return out;
  }
  // dst [B, H, T, D] from src [B, T, H, D] (inverse: the other way, rotating back).
  auto run = [=](const float* src, float* dst, bool backward) {
    parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / H, h = r % H;
        for (int64_t t = 0; t < T; ++t) {
          const float* in = backward ? src + (r * T + t) * D : src + ((b * T + t) * H + h) * D;
          float* out = backward ? dst + ((b * T + t) * H + h) * D : dst + (r * T + t) * D;
          std::memcpy(out, in, static_cast<size_t>(N) * sizeof(float));
          cpu::rope_rotate_row(out + N, in + N, rope.cos_of(b, t), rope.sin_of(b, t), P, /*interleaved=*/false,
                               /*inverse=*/backward);
        }
      }
    });
  };
  Tensor out = Tensor::empty({B, H, T, D});
  run(q.data<float>(), out.data<float>(), false);
  autograd::record(op, {q}, {out}, [run, shape = q.shape()](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    check_dtype(g, DType::F32, "mla_query_heads backward", "grad");
    Tensor dq = Tensor::empty(shape);
    run(g.data<float>(), dq.data<float>(), true);
    return TensorList{dq};
  });
  return out;
}

// kv_b: [B, S, H*(N+Dv)], wkv_b's output; k_rope: [B, S, P], the shared RoPE key before its rotation ->
//   k [B, H, S, N+P] = [k_nope | rope(k_rope)], the same rotated key in every head, and v [B, H, S, Dv].
// Backward: the heads' RoPE-key gradients summed in head order, then rotated back. One pass each way,
// where splitting heads, narrowing k_nope and v, H copies of the shared key and two concatenations made
// five copies forward and their zero-filled gradients and sums backward.
std::pair<Tensor, Tensor> mla_key_value_heads(const Tensor& kv_b, const Tensor& k_rope, int64_t H, int64_t N, int64_t Dv,
                                          const Tensor& positions, const ops::RopeCache& cache) {
  const char* op = "mla_key_value_heads";
  check_dtype(kv_b, DType::F32, op, "kv_b");
  check_dtype(k_rope, DType::F32, op, "k_rope");
  const Device device = dispatch_device(op, {&kv_b, &k_rope});  // before allocating: errors name the op
  const int64_t B = kv_b.size(0), S = kv_b.size(1), P = k_rope.size(-1), W = N + Dv, D = N + P;
  LOOM_CHECK(kv_b.ndim() == 3 && kv_b.size(2) == H * W, op, ": kv_b ", kv_b.describe(), " is not [B, S, ", H, "*", W,
             "]");
  LOOM_CHECK(k_rope.ndim() == 3 && k_rope.size(0) == B && k_rope.size(1) == S, op, ": k_rope ", k_rope.describe(),
             " does not match kv_b ", kv_b.describe());
  const RopeRows rope = rope_rows(positions, B, S, P, cache, op, device);
  if (device.is_cuda()) {
    Tensor k = Tensor::empty({B, H, S, D}, DType::F32, device), v = Tensor::empty({B, H, S, Dv}, DType::F32, device);
    cuda::mla_key_value_heads_forward(cuda_context(op, device), kv_b.data<float>(), k_rope.data<float>(),
                                      rope.cos.data<float>(), rope.sin.data<float>(), B, S, H, N, P, Dv,
                                      rope.per_batch, k.data<float>(), v.data<float>());
    autograd::record(op, {kv_b, k_rope}, {k, v},
                     [B, S, H, N, Dv, P, rope, kv_shape = kv_b.shape()](const autograd::BackwardContext& ctx) {
      const char* bop = "mla_key_value_heads backward";
      const Tensor& dk = ctx.grad_output(0);  // [B, H, S, N+P]
      const Tensor& dv = ctx.grad_output(1);  // [B, H, S, Dv]
      check_dtype(dk, DType::F32, bop, "grad");
      check_dtype(dv, DType::F32, bop, "grad");
      const Device device = dispatch_device(bop, {&dk, &dv, &rope.cos});
      Tensor dkv = Tensor::empty(kv_shape, DType::F32, device), dr = Tensor::empty({B, S, P}, DType::F32, device);
      cuda::mla_key_value_heads_backward(cuda_context(bop, device), dk.data<float>(), dv.data<float>(),
                                         rope.cos.data<float>(), rope.sin.data<float>(), B, S, H, N, P, Dv,
                                         rope.per_batch, dkv.data<float>(), dr.data<float>());
      return TensorList{dkv, dr};
    });
    return {k, v};
  }
  Tensor k = Tensor::empty({B, H, S, D}), v = Tensor::empty({B, H, S, Dv});
  Tensor rotated = Tensor::empty({B, S, P});  // rope(k_rope)
  {
    const float* pkv = kv_b.data<float>();
    const float* pr = k_rope.data<float>();
    float* pk = k.data<float>();
    float* pv = v.data<float>();
    float* prot = rotated.data<float>();
    parallel_for(0, B * S, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        cpu::rope_rotate_row(prot + r * P, pr + r * P, rope.cos_of(r / S, r % S), rope.sin_of(r / S, r % S), P, false,
                             false);
    });
    parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / H, h = r % H;
        for (int64_t s = 0; s < S; ++s) {
          const float* in = pkv + ((b * S + s) * H + h) * W;
          std::memcpy(pk + (r * S + s) * D, in, static_cast<size_t>(N) * sizeof(float));
          std::memcpy(pk + (r * S + s) * D + N, prot + (b * S + s) * P, static_cast<size_t>(P) * sizeof(float));
          std::memcpy(pv + (r * S + s) * Dv, in + N, static_cast<size_t>(Dv) * sizeof(float));
        }
      }
    });
  }
  autograd::record(op, {kv_b, k_rope}, {k, v},
                   [B, S, H, N, Dv, P, W, D, rope, kv_shape = kv_b.shape()](const autograd::BackwardContext& ctx) {
    const Tensor& dk = ctx.grad_output(0);  // [B, H, S, N+P]
    const Tensor& dv = ctx.grad_output(1);  // [B, H, S, Dv]
    check_dtype(dk, DType::F32, "mla_key_value_heads backward", "grad");
    check_dtype(dv, DType::F32, "mla_key_value_heads backward", "grad");
    Tensor dkv = Tensor::empty(kv_shape), dr = Tensor::empty({B, S, P});
    const float* pdk = dk.data<float>();
    const float* pdv = dv.data<float>();
    float* pkv = dkv.data<float>();
    float* pr = dr.data<float>();
    parallel_for(0, B * S, 16, [&](int64_t r0, int64_t r1) {
      std::vector<float> sum(static_cast<size_t>(P));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / S, s = r % S;
        for (int64_t h = 0; h < H; ++h) {
          const float* gk = pdk + ((b * H + h) * S + s) * D;
          float* out = pkv + (r * H + h) * W;
          std::memcpy(out, gk, static_cast<size_t>(N) * sizeof(float));
          std::memcpy(out + N, pdv + ((b * H + h) * S + s) * Dv, static_cast<size_t>(Dv) * sizeof(float));
          for (int64_t i = 0; i < P; ++i) sum[static_cast<size_t>(i)] = h == 0 ? gk[N + i] : sum[static_cast<size_t>(i)] + gk[N + i];
        }
        cpu::rope_rotate_row(pr + r * P, sum.data(), rope.cos_of(b, s), rope.sin_of(b, s), P, false, /*inverse=*/true);
      }
    });
    return TensorList{dkv, dr};
  });
  return {k, v};
}

}  // namespace loom::ops
