// Token embedding: a row gather forward, a deterministic scatter-add backward (backends/cpu/embedding.*).
// Legend: N tokens (the ids' dimensions flattened), V vocab rows, C channels.
#include "ops/embedding.h"

#include <cstdint>

#include "backends/backend.h"
#include "backends/cpu/embedding.h"
#include "backends/cuda/embedding.h"
#include "core/autograd.h"

namespace loom::ops {

Tensor embedding(const Tensor& ids, const Tensor& table) {
  LOOM_CHECK(ids.defined() && table.defined(), "embedding: ids and table must be defined");
  check_dtype(ids, DType::I32, "embedding", "ids");
  check_ndim(table, 2, "embedding", "table");
  LOOM_CHECK(table.dtype() == DType::F32 || table.dtype() == DType::BF16, "embedding: table is ",
             table.dtype(), ", expected f32 or bf16");
  check_same_device(ids, table, "embedding");
  const Device device = dispatch_device("embedding", {&ids, &table});  // before allocating: errors name the op
  LOOM_CHECK(table.dtype() == DType::F32 || !autograd::any_requires_grad({table}),
             "embedding: backward into a bf16 table is not supported yet; use f32 or NoGradGuard");
  const int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  const int64_t elem_bytes = static_cast<int64_t>(dtype_size(table.dtype()));
  int64_t bad = -1;
  int32_t bad_value = 0;
  if (device.is_cuda()) {
    const cuda::IdScan scan = cuda::scan_ids(cuda_context("embedding", device), ids.data<int32_t>(), N, V,
                                             INT64_MIN, "embedding");
    bad = scan.first_bad;
    bad_value = scan.bad_value;
  } else {
    bad = cpu::embedding_first_bad_id(ids.data<int32_t>(), N, V);
    if (bad >= 0) bad_value = ids.data<int32_t>()[bad];
  }
  LOOM_CHECK(bad < 0, "embedding: id ", bad_value, " at flat position ", bad,
             " is outside the table's [0, V) with V=", V);

  Shape out_shape = ids.shape();
  out_shape.push_back(C);  // [..., C]
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  if (device.is_cuda()) {
    cuda::embedding_forward(cuda_context("embedding", device), out.raw_data(), ids.data<int32_t>(), table.raw_data(),
                            N, V, C, elem_bytes);
  } else {
    cpu::embedding_forward(out.raw_data(), ids.data<int32_t>(), table.raw_data(), N, C, elem_bytes);
  }

  autograd::record("embedding", {ids, table}, {out}, [ids, V, C, N](const autograd::BackwardContext& ctx) {
    Tensor d_table;
    if (ctx.needs_input_grad(1)) {
      const Tensor& g = ctx.grad_output(0);
      const Device device = dispatch_device("embedding backward", {&ids, &g});
      d_table = Tensor::empty(Shape{V, C}, DType::F32, ids.device());
      if (device.is_cuda()) {
        cuda::embedding_backward(cuda_context("embedding backward", device), d_table.data<float>(),
                                 ids.data<int32_t>(), g.data<float>(), N, V, C);
      } else {
        cpu::embedding_backward(d_table.data<float>(), ids.data<int32_t>(), g.data<float>(), N, V, C);
      }
    }
    return TensorList{Tensor(), d_table};
  });
  return out;
}

Tensor dequantized_embedding(const Tensor& ids, const quant::QuantizedMatrix& table) {
  LOOM_CHECK(ids.defined(), "dequantized_embedding: ids must be defined");
  check_dtype(ids, DType::I32, "dequantized_embedding", "ids");
  require_cpu("dequantized_embedding", {&ids});
  const int64_t V = table.rows(), C = table.cols(), N = ids.numel();
  const int64_t bad = cpu::embedding_first_bad_id(ids.data<int32_t>(), N, V);
  LOOM_CHECK(bad < 0, "embedding: id ", bad < 0 ? 0 : ids.data<int32_t>()[bad], " at flat position ", bad,
             " is outside the table's [0, V) with V=", V);
  Shape out_shape = ids.shape();
  out_shape.push_back(C);  // [..., C]
  Tensor out = Tensor::empty(out_shape);
  const int32_t* pid = ids.data<int32_t>();
  float* po = out.data<float>();
  for (int64_t n = 0; n < N; ++n) table.dequantize_rows(pid[n], 1, po + n * C);  // B*T rows: small
  return out;
}

}  // namespace loom::ops
