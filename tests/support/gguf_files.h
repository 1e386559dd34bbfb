// GGUF files for tests: an existing file written again, its metadata and tensors edited on the way.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "support/files.h"

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

// The tiny Llama of tests/gguf/make_fixtures.py (2 layers, <|endoftext|>, <|im_start|>, <|im_end|>), its chat
// template replaced by a plain ChatML one (the fixture's own joins with spaces: not ChatML). Written once
// per test program, into a directory removed when it ends.
inline std::string chatml_tiny_gguf() {
  static const std::string path = [] {
    const std::string src = std::string(LOOM_SOURCE_DIR) + "/tests/models/llama/fixtures/tiny_llama.gguf";
    static const TempDir dir("chatml_tiny");
    const std::string out = dir / "tiny.gguf";
    const std::string chatml =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    return rewrite_gguf(src, out, [&](std::vector<gguf::KeyValue>& kv, auto&) {
      for (auto& e : kv) {
        if (e.key == "tokenizer.chat_template") e.value = gguf::Value{chatml};
      }
    });
  }();
  return path;
}

}  // namespace loom::test
