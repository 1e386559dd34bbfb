#include "quant/linear.h"

#include "core/autograd.h"
#include "core/error.h"

namespace loom::quant {

Tensor quantized_linear(const Tensor& x, const QuantizedMatrix& w, const Tensor& bias, const std::string& name) {
  LOOM_CHECK(x.defined() && x.dtype() == DType::F32 && x.device().is_cpu() && x.ndim() >= 1, name,
             ": a quantized weight multiplies f32 CPU activations, got ", x.defined() ? x.describe() : "undefined");
  LOOM_CHECK(!(autograd::grad_enabled() && x.requires_grad()), name, " is held quantized (",
             quant_type_name(w.type()), ") for inference only; there is no backward pass through it. Load the "
             "weights as f32 to train, or run under no-grad");
  const int64_t in = x.size(x.ndim() - 1), out = w.rows();
  LOOM_CHECK(in == w.cols(), name, ": x has in=", in, " features but the quantized weight is [", out, ", ",
             w.cols(), "]");
  if (bias.defined()) {
    LOOM_CHECK(bias.dtype() == DType::F32 && bias.ndim() == 1 && bias.size(0) == out, name, ": bias is ",
               bias.describe(), " but the layer has out=", out);
  }
  const int64_t M = x.numel() / in;
  Tensor y = Tensor::empty(x.shape().with_last(out));
  quantized_matmul(x.data<float>(), M, w, y.data<float>());
  if (bias.defined()) {
    const float* b = bias.data<float>();
    float* py = y.data<float>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < out; ++n) py[m * out + n] += b[n];
    }
  }
  return y;
}

}  // namespace loom::quant
