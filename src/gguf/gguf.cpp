#include "gguf/gguf.h"

#include <cstring>

#include "io/file.h"

namespace loom::gguf {

GgufFile GgufFile::open(const std::string& path) { return over(io::FileBytes::mapped(path), path); }

GgufFile GgufFile::from_memory(const uint8_t* data, size_t size, std::string label) {
  return over(io::FileBytes::copied(data, size), std::move(label));
}

GgufFile GgufFile::over(io::FileBytes bytes, std::string path) {
  GgufFile file;
  file.header_ = io::with_file_label(path, [&] { return parse_gguf(bytes.data, bytes.size); });
  file.path_ = std::move(path);
  file.base_ = bytes.data;
  file.owner_ = std::move(bytes.owner);
  return file;
}

const TensorInfo& GgufFile::info(const std::string& name) const {
  const TensorInfo* t = header_.find_tensor(name);
  LOOM_CHECK(t != nullptr, path_, ": no tensor named ", quoted(name), " (the file has ", header_.tensors.size(),
             " tensors)");
  return *t;
}

std::span<const uint8_t> GgufFile::bytes(const std::string& name) const {
  const TensorInfo& t = info(name);
  return {base_ + header_.data_start + t.offset, static_cast<size_t>(t.nbytes)};
}

Shape GgufFile::shape(const std::string& name) const {
  const TensorInfo& t = info(name);
  Shape s;
  for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) s.push_back(static_cast<int64_t>(*it));  // < 2^63 (parsed)
  return s;
}

Tensor GgufFile::dequantized(const std::string& name) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(shape(name), DType::F32);
  quant::dequantize(t.type, base_ + header_.data_start + t.offset, static_cast<int64_t>(t.numel()), out.data<float>());
  return out;
}

void write_gguf_file(const std::string& path, const std::vector<KeyValue>& metadata,
                     const std::vector<TensorEntry>& tensors) {
  io::write_file_atomically(path, [&](io::FileWriter& out) {
    auto write = [&](const void* p, size_t n) { out.write(p, n); };
    io::with_file_label(path, [&] { write_gguf(write, metadata, tensors); });
  });
}

}  // namespace loom::gguf
