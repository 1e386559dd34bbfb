// GGUF files for tests: an existing file written again, its metadata and tensors edited on the way.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace loom::test {

using GgufEdit = std::function<void(std::vector<gguf::KeyValue>&, std::vector<gguf::TensorEntry>&)>;

// Writes `source`'s metadata and tensors (in order, bytes as stored) to `out` after `edit`, if any,
// changed them; returns `out`.
inline std::string rewrite_gguf(const std::string& source, const std::string& out, const GgufEdit& edit = {}) {
  const gguf::GgufFile f = gguf::GgufFile::open(source);
  std::vector<gguf::KeyValue> kv = f.header().metadata;
  std::vector<gguf::TensorEntry> tensors;
  for (const gguf::TensorInfo& t : f.header().tensors) {
    auto b = f.bytes(t.name);
    tensors.push_back({t.name, t.ne, t.type, b.data(), b.size()});
  }
  if (edit) edit(kv, tensors);
  gguf::write_gguf_file(out, kv, tensors);
  return out;
}

}  // namespace loom::test
