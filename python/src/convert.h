// numpy <-> loom::Tensor at the boundary, and the helpers every binding file shares.
//
// In: arrays arrive C-contiguous with the exact dtype (python/loom/_arrays.py converts and range-checks
// before calling), and are copied into fresh tensors, so nothing the C++ side keeps can alias memory
// Python may free or mutate. Out: the array wraps the result tensor's own storage (no copy); the
// capsule keeps the tensor alive for as long as numpy needs it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::python {

namespace nb = nanobind;

template <typename T>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
// An array updated in place (optimizer steps, gradient clipping).
template <typename T>
using InOut = nb::ndarray<T, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<nb::numpy, T>;

template <typename T>
Shape shape_of(const nb::ndarray<T, nb::c_contig, nb::device::cpu>& a) {
  LOOM_CHECK(a.ndim() <= static_cast<size_t>(Shape::kMaxDims), "arrays have at most ", Shape::kMaxDims,
             " dimensions, got ", a.ndim());
  Shape s;
  for (size_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<int64_t>(a.shape(i)));
  return s;
}

// A copy of `a` as a CPU tensor of T's dtype.
template <typename T>
Tensor to_tensor(const In<T>& a) {
  Tensor t = Tensor::empty(shape_of(a), dtype_of<T>());
  if (a.size() > 0) std::memcpy(t.raw_data(), a.data(), a.size() * sizeof(T));
  return t;
}

// A tensor over `a`'s memory, no copy: only for arrays the call updates in place and never keeps.
template <typename T>
Tensor wrap_array(InOut<T>& a) {
  return Tensor::wrap(a.data(), shape_of(a), dtype_of<T>(), Device::cpu(), nullptr);
}

template <typename T>
Out<T> to_numpy_typed(const Tensor& t) {
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  return Out<T>(t.raw_data(), shape.size(), shape.data(), owner);
}

// Any loom tensor as a numpy array sharing its storage (bf16 comes out as a float32 copy).
inline nb::object to_numpy(const Tensor& t) {
  LOOM_CHECK(t.defined(), "to_numpy: undefined tensor");
  LOOM_CHECK(t.device().is_cpu(), "to_numpy: tensor is on ", t.device(), ", not the CPU");
  switch (t.dtype()) {
    case DType::F32: return nb::cast(to_numpy_typed<float>(t));
    case DType::BF16: return nb::cast(to_numpy_typed<float>(t.to(DType::F32)));
    case DType::I32: return nb::cast(to_numpy_typed<int32_t>(t));
    case DType::U16: return nb::cast(to_numpy_typed<uint16_t>(t));
    case DType::Bool: return nb::cast(to_numpy_typed<bool>(t));
  }
  LOOM_ASSERT(false, "unknown dtype");
  return nb::none();
}

// A copy of `t` (its own storage): for values that must not follow later changes to the tensor.
inline nb::object to_numpy_copy(const Tensor& t) { return to_numpy(t.clone()); }

// Runs `fn` with the GIL released: the C++ work never touches Python objects.
template <typename Fn>
auto without_gil(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

// For long C++ loops that run without the GIL (generation): call it often; about every 50 ms it takes
// the GIL and runs Python's signal handlers, so Ctrl-C raises KeyboardInterrupt in the caller instead
// of waiting for the loop to end. Any exception a handler raised is thrown as nb::python_error.
class InterruptCheck {
 public:
  void operator()() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(50)) return;
    last_ = now;
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

void bind_ops(nb::module_& m);
void bind_models(nb::module_& m);
void bind_train(nb::module_& m);
void bind_tokenizer(nb::module_& m);
void bind_dist(nb::module_& m);

}  // namespace loom::python
