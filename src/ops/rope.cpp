#include "ops/rope.h"

#include "backends/backend.h"
#include "backends/cpu/rope.h"
#include "backends/cuda/rope.h"
#include "core/autograd.h"

#include <cstring>

namespace loom::ops {

RopeCache make_rope_cache(int64_t max_len, int64_t head_dim, float theta) {
  LOOM_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope cache: head dimension must be even and positive, got ", head_dim);
  LOOM_CHECK(max_len > 0, "rope cache: max_len must be positive, got ", max_len);
  LOOM_CHECK(theta > 0.0f, "rope cache: theta must be positive, got ", theta);
  Tensor positions = Tensor::empty({max_len}, DType::I32);
  for (int64_t p = 0; p < max_len; ++p) positions.data<int32_t>()[p] = static_cast<int32_t>(p);
  RopeCache cache;
  cache.cos = Tensor::empty({max_len, head_dim / 2});
  cache.sin = Tensor::empty({max_len, head_dim / 2});
  cpu::rope_tables(cache.cos.data<float>(), cache.sin.data<float>(), positions.data<int32_t>(), max_len, head_dim,
                   theta);
  cache.theta = theta;
  cache.head_dim = head_dim;
  return cache;
}

std::pair<Tensor, Tensor> rope_tables(const Tensor& positions, int64_t d, float theta, const RopeCache& cache) {
  const int64_t num_pos = positions.numel(), half = d / 2;
  Tensor cos = Tensor::empty({num_pos, half}), sin = Tensor::empty({num_pos, half});
  const int32_t* pos = positions.data<int32_t>();
  if (!cache.defined()) {
    cpu::rope_tables(cos.data<float>(), sin.data<float>(), pos, num_pos, d, theta);
    return {cos, sin};
  }
  LOOM_CHECK(cache.head_dim == d && cache.theta == theta, "rope: the cache was built for D=", cache.head_dim,
             ", theta=", cache.theta, " but x has D=", d, " and theta=", theta);
  for (int64_t i = 0; i < num_pos; ++i) {
    LOOM_CHECK(pos[i] >= 0 && pos[i] < cache.max_len(), "rope: position ", pos[i], " is outside the cache [0, ",
               cache.max_len(), ") (the model's max_seq_len)");
    std::memcpy(cos.data<float>() + i * half, cache.cos.data<float>() + pos[i] * half, static_cast<size_t>(half) * 4);
    std::memcpy(sin.data<float>() + i * half, cache.sin.data<float>() + pos[i] * half, static_cast<size_t>(half) * 4);
  }
  return {cos, sin};
}

Tensor rope(const Tensor& x, const Tensor& positions, float theta, RopeStyle style) {
  return rope(x, positions, RopeCache{Tensor(), Tensor(), theta, x.defined() ? x.size(-1) : 0}, style);
}

Tensor rope(const Tensor& x, const Tensor& positions, const RopeCache& cache, RopeStyle style) {
  const float theta = cache.theta;
  check_dtype(x, DType::F32, "rope", "x");
  LOOM_CHECK(positions.defined(), "rope: positions are undefined");
  check_dtype(positions, DType::I32, "rope", "positions");
  // x picks the device; positions (a few ints, read on the host to build the tables) may be on the CPU
  // or on x's device.
  const Device device = dispatch_device("rope", {&x});
  LOOM_CHECK(positions.device().is_cpu() || positions.device() == device, "rope: positions are on ",
             positions.device(), " but x is on ", device, " (positions may be on the CPU or on x's device)");
  LOOM_CHECK(x.ndim() >= 2, "rope: x must be [..., T, D], got ", x.describe());
  const int64_t d = x.size(-1), t = x.size(-2);
  LOOM_CHECK(d % 2 == 0, "rope: head dimension D=", d, " must be even (x ", x.describe(), ")");
  LOOM_CHECK(theta > 0.0f, "rope: theta must be positive, got ", theta);
  const Shape leading = x.shape().drop_last(1);  // [..., T]
  const bool shared = positions.ndim() == 1 && positions.size(0) == t;
  LOOM_CHECK(shared || positions.shape() == leading, "rope: positions have shape ", positions.shape(),
             " but x ", x.describe(), " needs [", t, "] or ", leading);

  auto [cos, sin] = rope_tables(positions.device().is_cpu() ? positions : positions.to(Device::cpu()), d, theta,
                                cache);
  if (device.is_cuda()) {  // the host-built tables, moved once per call
    cos = cos.to(device);
    sin = sin.to(device);
  }
  const bool interleaved = style == RopeStyle::Interleaved;
  const bool per_row = !shared || leading.ndim() == 1;  // [T] positions for a [T, D] x are per row too
  const int64_t rows = x.numel() / std::max<int64_t>(d, 1);

  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device());
  if (device.is_cuda()) {
    cuda::rope_apply(cuda_context("rope", device), out.data<float>(), x.data<float>(), cos.data<float>(),
                     sin.data<float>(), rows, t, d, per_row, interleaved, /*inverse=*/false);
  } else {
    cpu::rope_apply(out.data<float>(), x.data<float>(), cos.data<float>(), sin.data<float>(), rows, t, d, per_row,
                    interleaved, /*inverse=*/false);
  }
  autograd::record("rope", {x}, {out},
                   [cos, sin, rows, t, d, per_row, interleaved](const autograd::BackwardContext& ctx) {
    // y = R x with R orthogonal, so dx = R^T dy: the rotation by the negative angle.
    const Tensor& dy = ctx.grad_output(0);
    const Device device = dispatch_device("rope backward", {&dy, &cos});
    Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device());
    if (device.is_cuda()) {
      cuda::rope_apply(cuda_context("rope backward", device), dx.data<float>(), dy.data<float>(), cos.data<float>(),
                       sin.data<float>(), rows, t, d, per_row, interleaved, /*inverse=*/true);
    } else {
      cpu::rope_apply(dx.data<float>(), dy.data<float>(), cos.data<float>(), sin.data<float>(), rows, t, d, per_row,
                      interleaved, /*inverse=*/true);
    }
    return TensorList{dx};
  });
  return out;
}

}  // namespace loom::ops
