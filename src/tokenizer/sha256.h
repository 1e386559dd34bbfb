// SHA-256 (FIPS 180-4), for fingerprinting tokenizer files in prepared datasets' meta.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::tokenizer {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  std::string hex_digest();  // finishes the hash; call once

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);

}  // namespace loom::tokenizer
