#include "io/safetensors.h"

#include <bit>
#include <cstring>
#include <limits>

#include "io/file.h"

namespace loom::io {

// The format is little-endian and tensors are read in place.
static_assert(std::endian::native == std::endian::little, "loom reads safetensors in place: little-endian only");

SafetensorsDtype to_safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return SafetensorsDtype::F32;
    case DType::BF16: return SafetensorsDtype::BF16;
    case DType::I32: return SafetensorsDtype::I32;
    case DType::U16: return SafetensorsDtype::U16;
    case DType::Bool: return SafetensorsDtype::BOOL;
  }
  LOOM_ASSERT(false, "unknown DType ", static_cast<int>(dtype));
  return SafetensorsDtype::F32;
}

std::optional<DType> to_loom_dtype(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::F32: return DType::F32;
    case SafetensorsDtype::BF16: return DType::BF16;
    case SafetensorsDtype::I32: return DType::I32;
    case SafetensorsDtype::U16: return DType::U16;
    case SafetensorsDtype::BOOL: return DType::Bool;
    default: return std::nullopt;
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file = over(FileBytes::mapped(path), path);
  file.zero_copy_ = true;
  return file;
}

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* data, size_t size, std::string label) {
  return over(FileBytes::copied(data, size), std::move(label));
}

SafetensorsFile SafetensorsFile::over(FileBytes bytes, std::string path) {
  SafetensorsFile file;
  file.header_ = with_file_label(path, [&] { return parse_safetensors_header(bytes.data, bytes.size); });
  file.path_ = std::move(path);
  file.base_ = bytes.data;
  file.owner_ = std::move(bytes.owner);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(header_.tensors.size());
  for (const auto& t : header_.tensors) out.push_back(t.name);
  return out;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const SafetensorsTensorInfo* t = header_.find(name);
  LOOM_CHECK(t != nullptr, path_, ": no tensor named ", quote_name(name), " (the file has ",
             header_.tensors.size(), " tensors)");
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  return {base_ + header_.data_start() + t.begin, static_cast<size_t>(t.nbytes())};
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  const std::optional<DType> dtype = to_loom_dtype(t.dtype);
  LOOM_CHECK(dtype.has_value(), path_, ": tensor ", quote_name(name), " has dtype ",
             safetensors_dtype_name(t.dtype),
             ", which loom tensors do not have (they are F32, BF16, I32, U16 or BOOL); read its bytes instead");
  LOOM_CHECK(t.shape.size() <= static_cast<size_t>(Shape::kMaxDims), path_, ": tensor ", quote_name(name),
             " has shape ", shape_string(t.shape), " with ", t.shape.size(),
             " dimensions; loom tensors have at most ", Shape::kMaxDims);
  Shape shape;
  for (uint64_t d : t.shape) {
    LOOM_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path_, ": tensor ",
               quote_name(name), " has dimension ", d, ", beyond loom's int64 dimensions");
    shape.push_back(static_cast<int64_t>(d));
  }
  uint8_t* p = base_ + header_.data_start() + t.begin;
  const size_t nbytes = static_cast<size_t>(t.nbytes());
  if (*dtype == DType::Bool) {
    for (size_t i = 0; i < nbytes; ++i) {
      LOOM_CHECK(p[i] <= 1, path_, ": tensor ", quote_name(name), " is BOOL but element ", i, " is byte ",
                 static_cast<int>(p[i]), ", not 0 or 1");
    }
  }
  if (zero_copy_ && reinterpret_cast<uintptr_t>(p) % dtype_size(*dtype) == 0) {
    return Tensor::wrap(p, shape, *dtype, Device::cpu(), owner_);
  }
  Tensor out = Tensor::empty(shape, *dtype);
  if (nbytes > 0) std::memcpy(out.raw_data(), p, nbytes);
  return out;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, Tensor> out;
  for (const auto& t : file.header().tensors) out.emplace(t.name, file.tensor(t.name));
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");  // no-op when the caller set "format"
  SafetensorsLayout layout;
  try {
    layout = plan_safetensors_layout(entries, meta);
  } catch (const Error& e) {
    throw Error(str(path, ": ", e.what()));
  }
  write_file_atomically(path, [&](FileWriter& out) {
    out.write(layout.prefix.data(), layout.prefix.size());
    for (size_t i : layout.order) {
      if (entries[i].nbytes > 0) out.write(entries[i].data, entries[i].nbytes);
    }
    LOOM_ASSERT(out.bytes_written() == layout.file_bytes(), "wrote ", out.bytes_written(), " bytes, planned ",
                layout.file_bytes());
  });
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(t.defined(), path, ": write_safetensors: tensor ", quote_name(name), " is undefined");
    LOOM_CHECK(t.device().is_cpu(), path, ": write_safetensors: tensor ", quote_name(name), " is on ",
               t.device(), "; copy it to the CPU first");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = to_safetensors_dtype(t.dtype());
    for (int64_t d : t.shape()) e.shape.push_back(static_cast<uint64_t>(d));
    e.data = t.raw_data();
    e.nbytes = t.nbytes();
    entries.push_back(std::move(e));
  }
  write_safetensors(path, entries, metadata);
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, NamedTensors(tensors.begin(), tensors.end()), metadata);
}

}  // namespace loom::io
