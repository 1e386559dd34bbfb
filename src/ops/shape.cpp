#include "ops/shape.h"

#include "backends/backend.h"
#include "backends/cuda/shape.h"
#include "core/autograd.h"
#include "core/parallel.h"

#include <cstring>

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

namespace loom::ops {
namespace {

// Copies x into out, where out's dimension order is x's with d0 and d1 swapped. Works on bytes.
void transpose_copy(const Tensor& x, Tensor& out, int d0, int d1) {
  const Shape& s = x.shape();
  const int n = s.ndim();
  std::vector<int64_t> in_strides(static_cast<size_t>(n));
  int64_t stride = 1;
  for (int i = n - 1; i >= 0; --i) {
    in_strides[static_cast<size_t>(i)] = stride;
    stride *= s[i];
  }
  // out dim i reads from x dim perm[i].
  std::vector<int> perm(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  std::swap(perm[static_cast<size_t>(d0)], perm[static_cast<size_t>(d1)]);
  const Shape& os = out.shape();
  const size_t elem = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  // Innermost output run: contiguous in x only if the last dim is untouched.
  const int64_t inner = (perm[static_cast<size_t>(n - 1)] == n - 1) ? os[n - 1] : 1;
  const int64_t outer = out.numel() / std::max<int64_t>(inner, 1);
  parallel_for(0, outer, 256, [&](int64_t b, int64_t e) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t o = b; o < e; ++o) {
      // Decompose o over the output's dims (excluding the inner run).
      int64_t rem = o;
      int last = inner > 1 ? n - 2 : n - 1;
      for (int i = last; i >= 0; --i) {
        idx[static_cast<size_t>(i)] = rem % os[i];
        rem /= os[i];
      }
      int64_t offset = 0;
      for (int i = 0; i <= last; ++i) offset += idx[static_cast<size_t>(i)] * in_strides[static_cast<size_t>(perm[static_cast<size_t>(i)])];
      std::memcpy(dst + static_cast<size_t>(o * inner) * elem, src + static_cast<size_t>(offset) * elem,
                  static_cast<size_t>(inner) * elem);
    }
  });
}

int normalize_dim(int d, int ndim, const char* op) {
  int r = d < 0 ? d + ndim : d;
  LOOM_CHECK(r >= 0 && r < ndim, op, ": dimension ", d, " out of range for ", ndim, " dimensions");
  return r;
}

}  // namespace

Tensor transpose(const Tensor& x, int d0, int d1) {
  LOOM_CHECK(x.defined(), "transpose: x is undefined");
  const Device device = dispatch_device("transpose", {&x});  // before allocating: errors name the op
  d0 = normalize_dim(d0, x.ndim(), "transpose");
  d1 = normalize_dim(d1, x.ndim(), "transpose");
  Shape out_shape = x.shape();
  std::swap(out_shape[d0], out_shape[d1]);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (d0 == d1) {
    out.copy_from(x);
  } else if (device.is_cuda()) {
    // x as [A, n0, M, n1, I] with lo < hi the swapped dimensions.
    const int lo = std::min(d0, d1), hi = std::max(d0, d1);
    const Shape& s = x.shape();
    int64_t M = 1, I = 1;
    for (int d = lo + 1; d < hi; ++d) M *= s[d];
    for (int d = hi + 1; d < s.ndim(); ++d) I *= s[d];
    cuda::transpose_copy(cuda_context("transpose", device), x.raw_data(), out.raw_data(), s.numel_before(lo), s[lo], M,
                         s[hi], I, dtype_size(x.dtype()));
  } else {
    transpose_copy(x, out, d0, d1);
  }
  autograd::record("transpose", {x}, {out}, [d0, d1](const autograd::BackwardContext& ctx) {
    return TensorList{transpose(ctx.grad_output(0), d0, d1)};
  });
  return out;
}

Tensor concat(const TensorList& xs, int dim) {
  LOOM_CHECK(!xs.empty(), "concat: no tensors given");
  const Tensor& first = xs[0];
  LOOM_CHECK(first.defined(), "concat: tensor 0 is undefined");
  dim = normalize_dim(dim, first.ndim(), "concat");
  Shape out_shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    LOOM_CHECK(x.defined() && x.ndim() == first.ndim() && x.dtype() == first.dtype(), "concat: tensor ", i, " (",
               x.describe(), ") does not match tensor 0 (", first.describe(), ")");
    for (int d = 0; d < first.ndim(); ++d) {
      LOOM_CHECK(d == dim || x.shape()[d] == first.shape()[d], "concat: tensor ", i, " has shape ", x.shape(),
                 ", tensor 0 has ", first.shape(), " (only dimension ", dim, " may differ)");
    }
    total += x.shape()[dim];
  }
  out_shape[dim] = total;
  const Device device = dispatch_device("concat", {&first});  // before allocating: errors name the op
  for (size_t i = 1; i < xs.size(); ++i) {
    LOOM_CHECK(xs[i].device() == device, "concat: tensor ", i, " is on ", xs[i].device(), " but tensor 0 is on ",
               device);
  }
  Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
  const int64_t outer = out_shape.numel_before(dim);
  int64_t inner = 1;
  for (int d = dim + 1; d < out_shape.ndim(); ++d) inner *= out_shape[d];
  const size_t elem = dtype_size(first.dtype());
  char* dst = static_cast<char*>(out.raw_data());
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) {
    const int64_t len = x.shape()[dim];
    const char* src = static_cast<const char*>(x.raw_data());
    if (device.is_cuda()) {
      cuda::copy_rows(cuda_context("concat", device), src, len, 0, dst, total, offset, outer, len, inner, elem, "concat");
    } else {
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(dst + static_cast<size_t>((o * total + offset) * inner) * elem,
                    src + static_cast<size_t>(o * len * inner) * elem, static_cast<size_t>(len * inner) * elem);
      }
    }
    offset += len;
    sizes.push_back(len);
  }
  autograd::record("concat", xs, {out}, [sizes, dim, outer, inner](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    const int64_t total_len = g.shape()[dim];
    TensorList grads;
    int64_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Shape s = g.shape();
      s[dim] = sizes[i];
      Tensor gi = Tensor::empty(s, g.dtype(), g.device());
      if (ctx.needs_input_grad(static_cast<int>(i))) {
        const float* src = g.data<float>();
        float* d = gi.data<float>();
        if (g.device().is_cuda()) {
          cuda::copy_rows(cuda_context("concat backward", g.device()), src, total_len, off, d, sizes[i], 0, outer,
                          sizes[i], inner, sizeof(float), "concat backward");
        } else {
          for (int64_t o = 0; o < outer; ++o) {
            std::memcpy(d + o * sizes[i] * inner, src + (o * total_len + off) * inner,
                        static_cast<size_t>(sizes[i] * inner) * sizeof(float));
          }
        }
        grads.push_back(gi);
      } else {
        grads.push_back(Tensor());
      }
      off += sizes[i];
    }
    return grads;
  });
  return out;
}

namespace {

// Copies, for each of `outer` rows, `len * inner` elements from src (rows of src_len * inner, starting
// at src_off * inner) to dst (rows of dst_len * inner, starting at dst_off * inner).
void copy_rows(const char* src, int64_t src_len, int64_t src_off, char* dst, int64_t dst_len, int64_t dst_off,
               int64_t outer, int64_t len, int64_t inner, size_t elem) {
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + static_cast<size_t>((o * dst_len + dst_off) * inner) * elem,
                src + static_cast<size_t>((o * src_len + src_off) * inner) * elem, static_cast<size_t>(len * inner) * elem);
  }
}

}  // namespace

Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  LOOM_CHECK(x.defined(), "narrow: x is undefined");
  const Device device = dispatch_device("narrow", {&x});  // before allocating: errors name the op
  dim = normalize_dim(dim, x.ndim(), "narrow");
  const int64_t size = x.shape()[dim];
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: range [", start, ", ", start + length,
             ") is outside dimension ", dim, " of size ", size, " of ", x.describe());
  Shape out_shape = x.shape();
  out_shape[dim] = length;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  const int64_t outer = x.shape().numel_before(dim);
  int64_t inner = 1;
  for (int d = dim + 1; d < x.ndim(); ++d) inner *= x.shape()[d];
  const size_t elem = dtype_size(x.dtype());
  if (device.is_cuda()) {
    cuda::copy_rows(cuda_context("narrow", device), x.raw_data(), size, start, out.raw_data(), length, 0, outer, length,
                    inner, elem, "narrow");
  } else {
    copy_rows(static_cast<const char*>(x.raw_data()), size, start, static_cast<char*>(out.raw_data()), length, 0,
              outer, length, inner, elem);
  }
  Shape in_shape = x.shape();
  autograd::record("narrow", {x}, {out}, [in_shape, dim, start, length, outer, inner](const autograd::BackwardContext& ctx) {
    const Tensor& g = ctx.grad_output(0);
    check_dtype(g, DType::F32, "narrow backward", "grad");
    Tensor gx = Tensor::zeros(in_shape, DType::F32, g.device());
    if (g.device().is_cuda()) {
      cuda::copy_rows(cuda_context("narrow backward", g.device()), g.raw_data(), length, 0, gx.raw_data(), in_shape[dim],
                      start, outer, length, inner, sizeof(float), "narrow backward");
      return TensorList{gx};
    }
    copy_rows(static_cast<const char*>(g.raw_data()), length, 0, static_cast<char*>(gx.raw_data()), in_shape[dim],
              start, outer, length, inner, sizeof(float));
    return TensorList{gx};
  });
  return out;
}

}  // namespace loom::ops
