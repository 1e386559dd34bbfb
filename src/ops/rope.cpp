#include "ops/rope.h"

#include "backends/backend.h"
#include "backends/cpu/rope.h"
#include "core/autograd.h"

namespace loom::ops {

Tensor rope(const Tensor& x, const Tensor& positions, float theta, RopeStyle style) {
  check_dtype(x, DType::F32, "rope", "x");
  LOOM_CHECK(positions.defined(), "rope: positions are undefined");
  check_dtype(positions, DType::I32, "rope", "positions");
  require_cpu("rope", {&x, &positions});
  LOOM_CHECK(x.ndim() >= 2, "rope: x must be [..., T, D], got ", x.describe());
  const int64_t d = x.size(-1), t = x.size(-2);
  LOOM_CHECK(d % 2 == 0, "rope: head dimension D=", d, " must be even (x ", x.describe(), ")");
  LOOM_CHECK(theta > 0.0f, "rope: theta must be positive, got ", theta);
  const Shape leading = x.shape().drop_last(1);  // [..., T]
  const bool shared = positions.ndim() == 1 && positions.size(0) == t;
  LOOM_CHECK(shared || positions.shape() == leading, "rope: positions have shape ", positions.shape(),
             " but x ", x.describe(), " needs [", t, "] or ", leading);

  const int64_t num_pos = positions.numel();
  Tensor cos = Tensor::empty({num_pos, d / 2}), sin = Tensor::empty({num_pos, d / 2});
  cpu::rope_tables(cos.data<float>(), sin.data<float>(), positions.data<int32_t>(), num_pos, d, theta);
  const bool interleaved = style == RopeStyle::Interleaved;
  const bool per_row = !shared || leading.ndim() == 1;  // [T] positions for a [T, D] x are per row too
  const int64_t rows = x.numel() / std::max<int64_t>(d, 1);

  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device());
  cpu::rope_apply(out.data<float>(), x.data<float>(), cos.data<float>(), sin.data<float>(), rows, t, d,
                  per_row, interleaved, /*inverse=*/false);
  autograd::record("rope", {x}, {out},
                   [cos, sin, rows, t, d, per_row, interleaved](const autograd::BackwardContext& ctx) {
    // y = R x with R orthogonal, so dx = R^T dy: the rotation by the negative angle.
    const Tensor& dy = ctx.grad_output(0);
    Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device());
    cpu::rope_apply(dx.data<float>(), dy.data<float>(), cos.data<float>(), sin.data<float>(), rows, t, d,
                    per_row, interleaved, /*inverse=*/true);
    return TensorList{dx};
  });
  return out;
}

}  // namespace loom::ops
