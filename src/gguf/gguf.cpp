#include "gguf/gguf.h"

#include <cstring>

#include "io/file.h"

namespace loom::gguf {

GgufFile GgufFile::open(const std::string& path) {
  std::shared_ptr<io::MappedFile> mapped = io::MappedFile::open(path);
  GgufFile file;
  file.path_ = path;
  try {
    file.header_ = parse_gguf(mapped->data(), mapped->size());
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    throw Error(str(path, ": ", e.what()));
  }
  file.base_ = mapped->data();
  file.owner_ = std::move(mapped);
  return file;
}

GgufFile GgufFile::from_memory(const uint8_t* data, size_t size, std::string label) {
  GgufFile file;
  file.path_ = std::move(label);
  try {
    file.header_ = parse_gguf(data, size);
  } catch (const Error& e) {
    throw Error(str(file.path_, ": ", e.what()));
  }
  auto copy = std::make_shared<std::vector<uint8_t>>(data, data + size);
  file.base_ = copy->data();
  file.owner_ = std::move(copy);
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
    try {
      write_gguf([&](const void* p, size_t n) { out.write(p, n); }, metadata, tensors);
    } catch (const IoError&) {
      throw;
    } catch (const Error& e) {
      throw Error(str(path, ": ", e.what()));
    }
  });
}

}  // namespace loom::gguf
