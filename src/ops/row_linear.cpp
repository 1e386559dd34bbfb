#include "ops/row_linear.h"

#include "backends/backend.h"
#include "backends/cpu/row_linear.h"

namespace loom::ops {

Tensor row_linear(const Tensor& x, const Tensor& w) {
  LOOM_CHECK(x.defined() && w.defined(), "row_linear: x and w must be defined");
  check_dtype(x, DType::F32, "row_linear", "x");
  check_dtype(w, DType::F32, "row_linear", "w");
  check_ndim(x, 2, "row_linear", "x");
  check_ndim(w, 2, "row_linear", "w");
  require_cpu("row_linear", {&x, &w});
  LOOM_CHECK(x.size(1) == w.size(1), "row_linear: x ", x.describe(), " has K=", x.size(1), " but w ", w.describe(),
             " has K=", w.size(1));
  Tensor y = Tensor::empty({x.size(0), w.size(0)});
  cpu::row_linear(x.data<float>(), x.size(0), x.size(1), w.data<float>(), w.size(0), y.data<float>());
  return y;
}

}  // namespace loom::ops
