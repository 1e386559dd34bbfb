// Tensor: a contiguous, typed, shaped view of device memory, plus the autodiff bookkeeping.
//
// Conventions:
//   * Tensors are always contiguous (row-major, outermost dimension first). Kernels therefore take raw
//     pointers and sizes; layout changes are explicit ops (or fused into the kernels that need them).
//   * Copying a Tensor copies a handle: both share one TensorImpl (as in PyTorch). `view()` makes a new
//     handle over the same storage with another shape; `clone()` copies the data.
//   * Autodiff state lives in the impl: `requires_grad` for leaves (parameters), `grad_fn` for results of
//     recorded ops, and `grad`, which backward() accumulates into for leaves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace loom {

namespace autograd {
struct Node;
}

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // ---- construction ---------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  // Copies `values` (numel must match the shape) into a new CPU tensor of T's dtype.
  template <typename T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);
  // Wraps existing memory without copying; `keep_alive` owns it (e.g. an mmap'd file).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device,
                     std::shared_ptr<void> keep_alive);

  // ---- metadata ------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int ndim() const { return shape().ndim(); }
  int64_t size(int dim) const { return shape()[dim]; }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  std::string describe() const;  // "f32[2, 3] on cpu"

  // ---- data ------------------------------------------------------------------------------------
  void* raw_data() const;
  // Typed pointer; checks that T matches the dtype.
  template <typename T>
  T* data() const {
    LOOM_CHECK(dtype() == dtype_of<T>(), "tensor is ", dtype(), ", not ", dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor, as float.
  float item() const;

  // Same storage, another shape with the same numel. Not recorded for autodiff: use ops::reshape.
  Tensor view(const Shape& shape) const;
  // Rows [start, start+length) of dimension 0, sharing storage (contiguous, so no copy). Not recorded.
  Tensor slice(int64_t start, int64_t length) const;
  // Same data and storage, cut off from autodiff.
  Tensor detach() const;
  // A copy with its own storage (not recorded for autodiff).
  Tensor clone() const;
  // A copy converted to `dtype` (f32 <-> bf16 rounds to nearest even; not recorded).
  Tensor to(DType dtype) const;
  // The same values on `device` (host <-> GPU, GPU <-> GPU); *this when already there. Not recorded.
  // Copies to the host wait for the device, so the result is ready to read.
  Tensor to(Device device) const;

  // In place, not recorded.
  void fill_(float value);
  void copy_from(const Tensor& src);  // same shape and dtype
  void zero_() { fill_(0.0f); }

  // ---- autodiff ------------------------------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf as requiring a gradient (parameters). Returns *this for chaining.
  Tensor& set_requires_grad(bool value = true);
  // The accumulated gradient of a leaf; undefined until backward() reaches it.
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  int output_index() const;
  void set_grad_fn(std::shared_ptr<autograd::Node> node, int output_index);
  // backward() from this scalar: accumulates d(this)/d(leaf) into every leaf's grad.
  void backward() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  const TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::F32;
  // autodiff
  bool requires_grad = false;
  std::shared_ptr<autograd::Node> grad_fn;
  int output_index = 0;
  Tensor grad;
};

using TensorList = std::vector<Tensor>;

// Checks that `t` has the given dtype, naming the op and argument in the error.
void check_dtype(const Tensor& t, DType expected, const char* op, const char* arg);
// Checks that `t` is defined and has `ndim` dimensions.
void check_ndim(const Tensor& t, int ndim, const char* op, const char* arg);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);

template <typename T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
             " values do not fill shape ", shape);
  Tensor t = empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  LOOM_CHECK(device().is_cpu(), "to_vector needs a CPU tensor, got ", device());
  const T* p = data<T>();
  return std::vector<T>(p, p + numel());
}

}  // namespace loom
