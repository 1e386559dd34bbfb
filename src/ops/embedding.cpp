// Token embedding: a row gather forward, a deterministic scatter-add backward (backends/cpu/embedding.*).
// Legend: N tokens (the ids' dimensions flattened), V vocab rows, C channels.
#include "ops/embedding.h"

#include "backends/backend.h"
#include "backends/cpu/embedding.h"
#include "core/autograd.h"

namespace loom::ops {

Tensor embedding(const Tensor& ids, const Tensor& table) {
  LOOM_CHECK(ids.defined() && table.defined(), "embedding: ids and table must be defined");
  check_dtype(ids, DType::I32, "embedding", "ids");
  check_ndim(table, 2, "embedding", "table");
  LOOM_CHECK(table.dtype() == DType::F32 || table.dtype() == DType::BF16, "embedding: table is ",
             table.dtype(), ", expected f32 or bf16");
  check_same_device(ids, table, "embedding");
  require_cpu("embedding", {&ids, &table});
  LOOM_CHECK(table.dtype() == DType::F32 || !autograd::any_requires_grad({table}),
             "embedding: backward into a bf16 table is not supported yet; use f32 or NoGradGuard");
  const int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  const int32_t* pid = ids.data<int32_t>();
  const int64_t bad = cpu::embedding_first_bad_id(pid, N, V);
  LOOM_CHECK(bad < 0, "embedding: id ", (bad >= 0 ? pid[bad] : 0), " at flat position ", bad,
             " is outside the table's [0, V) with V=", V);

  Shape out_shape = ids.shape();
  out_shape.push_back(C);  // [..., C]
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  cpu::embedding_forward(out.raw_data(), pid, table.raw_data(), N, C,
                         static_cast<int64_t>(dtype_size(table.dtype())));

  autograd::record("embedding", {ids, table}, {out}, [ids, V, C, N](const autograd::BackwardContext& ctx) {
    Tensor d_table;
    if (ctx.needs_input_grad(1)) {
      d_table = Tensor::empty(Shape{V, C}, DType::F32, ids.device());
      cpu::embedding_backward(d_table.data<float>(), ids.data<int32_t>(), ctx.grad_output(0).data<float>(), N,
                              V, C);
    }
    return TensorList{Tensor(), d_table};
  });
  return out;
}

}  // namespace loom::ops
