#include "core/tensor.h"

#include <cmath>
#include <cstring>

#include "core/autograd.h"
#include "core/hooks.h"
#include "core/parallel.h"

namespace loom {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  impl->storage = std::make_shared<Storage>(bytes, device);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(0.0f);
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device,
                    std::shared_ptr<void> keep_alive) {
  auto impl = std::make_shared<TensorImpl>();
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  impl->storage = std::make_shared<Storage>(data, bytes, device, std::move(keep_alive));
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

const TensorImpl& Tensor::checked() const {
  LOOM_CHECK(impl_ != nullptr, "use of an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device(); }

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype(), shape(), " on ", device());
}

void* Tensor::raw_data() const {
  const TensorImpl& impl = checked();
  return static_cast<char*>(impl.storage->data()) + impl.offset_bytes;
}

float Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item() needs a one-element tensor, got ", describe());
  LOOM_CHECK(device().is_cpu(), "item() needs a CPU tensor, got ", device());
  switch (dtype()) {
    case DType::F32: return *data<float>();
    case DType::BF16: return data<bf16>()->to_float();
    case DType::I32: return static_cast<float>(*data<int32_t>());
    case DType::U16: return static_cast<float>(*data<uint16_t>());
    case DType::Bool: return *data<bool>() ? 1.0f : 0.0f;
  }
  return 0.0f;
}

Tensor Tensor::view(const Shape& shape) const {
  const TensorImpl& impl = checked();
  LOOM_CHECK(shape.numel() == impl.shape.numel(), "view: cannot view ", describe(), " as ", shape,
             " (", impl.shape.numel(), " vs ", shape.numel(), " elements)");
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl.storage;
  v->offset_bytes = impl.offset_bytes;
  v->shape = shape;
  v->dtype = impl.dtype;
  return Tensor(std::move(v));
}

Tensor Tensor::slice(int64_t start, int64_t length) const {
  const TensorImpl& impl = checked();
  LOOM_CHECK(impl.shape.ndim() >= 1, "slice: ", describe(), " has no dimension to slice");
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= impl.shape[0], "slice: rows [", start, ", ",
             start + length, ") out of range for ", describe());
  Shape shape = impl.shape;
  int64_t row = 1;  // elements per row of dimension 0
  for (int d = 1; d < shape.ndim(); ++d) row *= shape[d];
  shape[0] = length;
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl.storage;
  v->offset_bytes = impl.offset_bytes + static_cast<size_t>(start * row) * dtype_size(impl.dtype);
  v->shape = shape;
  v->dtype = impl.dtype;
  return Tensor(std::move(v));
}

Tensor Tensor::detach() const { return view(shape()); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return clone();
  if (!device().is_cpu()) {
    // f32 <-> bf16 (mixed precision's hot conversions) on the device; the rest through the host.
    Tensor out = empty(shape(), target, device());
    if (numel() == 0 || hooks::device_convert(out.raw_data(), target, raw_data(), dtype(), numel(), device())) return out;
    return to(Device::cpu()).to(target).to(device());
  }
  Tensor out = empty(shape(), target, device());
  const int64_t n = numel();
  auto load = [&](int64_t i) -> float {
    switch (dtype()) {
      case DType::F32: return static_cast<const float*>(raw_data())[i];
      case DType::BF16: return static_cast<const bf16*>(raw_data())[i].to_float();
      case DType::I32: return static_cast<float>(static_cast<const int32_t*>(raw_data())[i]);
      case DType::U16: return static_cast<float>(static_cast<const uint16_t*>(raw_data())[i]);
      case DType::Bool: return static_cast<const bool*>(raw_data())[i] ? 1.0f : 0.0f;
    }
    return 0.0f;
  };
  if (dtype() == DType::F32 && target == DType::BF16) {  // the mixed-precision GEMMs' hot conversion
    hooks::convert_f32_to_bf16(static_cast<const float*>(raw_data()), out.data<bf16>(), n);
    return out;
  }
  if (dtype() == DType::U16 && target == DType::I32) {  // token ids: exact integer path
    const uint16_t* s = static_cast<const uint16_t*>(raw_data());
    int32_t* d = out.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
    return out;
  }
  parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = load(i);
      switch (target) {
        case DType::F32: out.data<float>()[i] = v; break;
        case DType::BF16: out.data<bf16>()[i] = bf16::from_float(v); break;
        case DType::I32: out.data<int32_t>()[i] = static_cast<int32_t>(v); break;
        case DType::U16: out.data<uint16_t>()[i] = static_cast<uint16_t>(v); break;
        case DType::Bool: out.data<bool>()[i] = v != 0.0f; break;
      }
    }
  });
  return out;
}

void Tensor::fill_(float value) {
  if (!device().is_cpu()) {
    // Zero is all-zero bytes in every dtype; other values are filled on the host and copied.
    if (value == 0.0f && !std::signbit(value)) {
      hooks::device_zero(raw_data(), device(), nbytes(), "fill_");
    } else {
      copy_from(full(shape(), value, dtype(), Device::cpu()));
    }
    return;
  }
  const int64_t n = numel();
  switch (dtype()) {
    case DType::F32: {
      float* p = data<float>();
      parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, value); });
      break;
    }
    case DType::BF16: {
      bf16* p = data<bf16>();
      bf16 v = bf16::from_float(value);
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      break;
    }
    case DType::I32: std::fill(data<int32_t>(), data<int32_t>() + n, static_cast<int32_t>(value)); break;
    case DType::U16: std::fill(data<uint16_t>(), data<uint16_t>() + n, static_cast<uint16_t>(value)); break;
    case DType::Bool: std::fill(data<bool>(), data<bool>() + n, value != 0.0f); break;
  }
}

void Tensor::copy_from(const Tensor& src) {
  LOOM_CHECK(src.shape() == shape() && src.dtype() == dtype(), "copy_from: source ", src.describe(),
             " does not match destination ", describe());
  if (raw_data() == src.raw_data() && device() == src.device()) return;
  if (!device().is_cpu() || !src.device().is_cpu()) {
    hooks::device_copy(raw_data(), device(), src.raw_data(), src.device(), nbytes(),
                       device().is_cpu() ? "copy to cpu" : "copy to cuda");
    return;
  }
  char* d = static_cast<char*>(raw_data());
  const char* s = static_cast<const char*>(src.raw_data());
  const int64_t n = static_cast<int64_t>(nbytes());
  parallel_for(0, n, 1 << 18, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, static_cast<size_t>(e - b)); });
}

bool Tensor::requires_grad() const { return checked().requires_grad || checked().grad_fn != nullptr; }

Tensor& Tensor::set_requires_grad(bool value) {
  LOOM_CHECK(!value || is_floating(dtype()), "only floating-point tensors can require grad, got ",
             describe());
  LOOM_CHECK(checked().grad_fn == nullptr, "set_requires_grad: only leaves (not results of ops) can be marked");
  impl_->requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return checked().grad; }

void Tensor::set_grad(const Tensor& grad) {
  LOOM_CHECK(!grad.defined() || grad.shape() == shape(), "set_grad: gradient ", grad.describe(),
             " does not match ", describe());
  impl_->grad = grad;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return checked().grad_fn; }
int Tensor::output_index() const { return checked().output_index; }

void Tensor::set_grad_fn(std::shared_ptr<autograd::Node> node, int output_index) {
  checked();
  impl_->grad_fn = std::move(node);
  impl_->output_index = output_index;
}

void Tensor::backward() const { autograd::backward(*this); }

void check_dtype(const Tensor& t, DType expected, const char* op, const char* arg) {
  LOOM_CHECK(t.defined(), op, ": ", arg, " is undefined");
  LOOM_CHECK(t.dtype() == expected, op, ": ", arg, " must be ", expected, ", got ", t.describe());
}

void check_ndim(const Tensor& t, int ndim, const char* op, const char* arg) {
  LOOM_CHECK(t.defined(), op, ": ", arg, " is undefined");
  LOOM_CHECK(t.ndim() == ndim, op, ": ", arg, " must have ", ndim, " dimensions, got shape ", t.shape());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  LOOM_CHECK(a.device() == b.device(), op, ": tensors are on different devices (", a.device(), " and ",
             b.device(), ")");
}

}  // namespace loom
