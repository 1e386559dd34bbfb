// safetensors files as loom tensors: a memory-mapped reader and an atomic writer.
//
//   auto file = io::SafetensorsFile::open("model.safetensors");
//   Tensor w = file.tensor("layers.0.attn.q_proj.weight");   // zero-copy when aligned
//   io::write_safetensors("out.safetensors", io::NamedTensors{{"w", w}}, {{"step", "100"}});
//
// Validation (the format's rules, every violation a loom::Error naming the problem) lives in
// safetensors_format.h. Zero-copy: a tensor whose bytes in the mapping are aligned for its dtype wraps
// the mapping (the Tensor keeps it alive); otherwise it is copied. Files that loom or the reference
// library wrote are always aligned: the header is padded to 8 bytes and tensors are laid out widest dtype
// first. The mapping is copy-on-write, so modifying a loaded tensor never changes the file.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors_format.h"

namespace loom::io {

struct FileBytes;

// The safetensors dtype of a loom dtype, and back (nullopt where loom has no such dtype).
SafetensorsDtype to_safetensors_dtype(DType dtype);
std::optional<DType> to_loom_dtype(SafetensorsDtype dtype);

class SafetensorsFile {
 public:
  // Maps and validates the file. Errors are loom::IoError (cannot read) or loom::Error (malformed),
  // both prefixed with the path.
  static SafetensorsFile open(const std::string& path);
  // Validates a file held in memory (`label` names it in errors). Tensors from it are always copies.
  static SafetensorsFile from_memory(const uint8_t* data, size_t size, std::string label = "<memory>");

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  size_t size() const { return header_.tensors.size(); }
  // Tensor names in file order (by data offset).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return header_.find(name) != nullptr; }
  // Dtype, shape and byte range of a tensor; throws naming the file and the tensor if absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // The tensor as a loom CPU tensor. Throws if its dtype has no loom equivalent (F16, I64, ...: read
  // those with bytes()), if it has more than Shape::kMaxDims dimensions, or, for BOOL, if a byte is
  // neither 0 nor 1 (loom's bool is a C++ bool, for which other values are undefined behaviour).
  Tensor tensor(const std::string& name) const;
  // The tensor's raw little-endian bytes, valid while this object (or a tensor from it) lives.
  std::span<const uint8_t> bytes(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  static SafetensorsFile over(FileBytes bytes, std::string path);  // parses; `path` names it in errors
  std::string path_;
  std::shared_ptr<void> owner_;  // keeps the bytes alive: a MappedFile, or a copy of the buffer
  uint8_t* base_ = nullptr;      // the start of the file's bytes
  bool zero_copy_ = false;       // whether tensors may wrap the bytes (only for a private mapping)
  SafetensorsHeader header_;
};

// Every tensor of a file, by name (loom dtypes only).
std::map<std::string, Tensor> load_safetensors(const std::string& path);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes CPU tensors atomically (see write_file_atomically) in the reference's layout. `metadata` gains
// {"format": "pt"} unless it sets "format" itself (Hugging Face's loaders check for it).
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Raw entries, for dtypes loom tensors lack (an I64 step count, F16 weights); metadata as above.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace loom::io
