// A family's state for incremental decoding (a KV cache, or a latent cache), opaque to callers: the
// decode loop (generate/generate.h) only asks how full it is and clears it.
#pragma once

#include <cstdint>

namespace loom::nn {

class DecodeCache {
 public:
  virtual ~DecodeCache() = default;
  // Tokens already fed.
  virtual int64_t length() const = 0;
  // Tokens it can hold (the model's context length).
  virtual int64_t capacity() const = 0;
  // Forgets every token (decoding starts again at position 0).
  virtual void clear() = 0;
};

}  // namespace loom::nn
