// GGUF files as loom tensors: a memory-mapped reader and an atomic writer (the format and its rules are
// in gguf/format.h).
//
//   auto file = gguf::GgufFile::open("model.gguf");
//   const std::string& arch = file.header().get_string("general.architecture");
//   Tensor w = file.dequantized("blk.0.attn_q.weight");  // f32, shape [ne1, ne0] (outermost first)
//
// Shapes: GGUF lists dimensions innermost first (ne[0] is contiguous); loom's shapes are outermost first,
// so a tensor with ne = [C, V] is a loom [V, C] tensor. Both are row-major with the same bytes: a Linear
// weight [out, in] is ne = [in, out] in GGUF, with no transposition.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "gguf/format.h"
#include "io/file.h"

namespace loom::gguf {

class GgufFile {
 public:
  // Maps and validates the file. Errors are loom::IoError (cannot read) or loom::Error (malformed),
  // both prefixed with the path.
  static GgufFile open(const std::string& path);
  // Validates a file held in memory (copied; `label` names it in errors).
  static GgufFile from_memory(const uint8_t* data, size_t size, std::string label = "<memory>");

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  // The tensor's info; throws naming the file and the tensor if absent.
  const TensorInfo& info(const std::string& name) const;
  // Its stored bytes (blocks for quantized types), valid while this object lives, or while a copy of
  // owner() does: what keeps the bytes (the mapping) alive, for a holder that reads them in place.
  std::span<const uint8_t> bytes(const std::string& name) const;
  std::shared_ptr<const void> owner() const { return owner_; }
  // Its loom shape: ne reversed (outermost first).
  Shape shape(const std::string& name) const;
  // The tensor as f32 (quant::dequantize), shape as shape(name).
  Tensor dequantized(const std::string& name) const;

 private:
  GgufFile() = default;
  static GgufFile over(io::FileBytes bytes, std::string path);  // parses; `path` names it in errors
  std::string path_;
  std::shared_ptr<void> owner_;  // keeps the bytes alive: a MappedFile, or a copy of the buffer
  const uint8_t* base_ = nullptr;
  Header header_;
};

// Writes a GGUF file atomically (io::write_file_atomically): a crash leaves the old file or the new one.
void write_gguf_file(const std::string& path, const std::vector<KeyValue>& metadata,
                     const std::vector<TensorEntry>& tensors);

}  // namespace loom::gguf
