#include "ops/shape.h"

#include "core/autograd.h"

namespace loom::ops {

Tensor reshape(const Tensor& x, std::vector<int64_t> dims) {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      LOOM_CHECK(infer < 0, "reshape: only one dimension may be -1 in ", Shape(std::vector<int64_t>(dims.size(), 1)));
      infer = static_cast<int>(i);
    } else {
      known *= dims[i];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 when reshaping ", x.describe());
    dims[static_cast<size_t>(infer)] = x.numel() / known;
  }
  Tensor out = x.view(Shape(dims));  // checks numel
  Shape in_shape = x.shape();
  autograd::record("reshape", {x}, {out}, [in_shape](const autograd::BackwardContext& ctx) {
    return TensorList{ctx.grad_output(0).view(in_shape)};
  });
  return out;
}

}  // namespace loom::ops
