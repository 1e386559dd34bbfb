// Token files: the flat little-endian arrays of token ids that `loom prepare` writes (train.bin,
// val.bin), memory-mapped read-only. The element type (uint16 or uint32) comes from the meta.json that
// sits next to them ({"dtype": "uint16"|"uint32", "vocab_size", ...}) or is given explicitly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace loom::data {

enum class TokenDType : uint8_t { U16, U32 };

inline size_t token_dtype_size(TokenDType t) { return t == TokenDType::U16 ? 2 : 4; }
const char* token_dtype_name(TokenDType t);  // "uint16" / "uint32"
// Parses "uint16"/"u16"/"uint32"/"u32"; throws naming the value otherwise.
TokenDType token_dtype_from_name(const std::string& name);

// The token file's metadata from `loom prepare`'s meta.json.
struct TokenMeta {
  TokenDType dtype = TokenDType::U16;
  int64_t vocab_size = 0;  // 0 when meta.json does not say
  std::optional<int64_t> eot_id;
};
// Reads meta.json; throws loom::IoError if missing, loom::Error if malformed (naming the key).
TokenMeta read_token_meta(const std::string& meta_path);

class TokenFile {
 public:
  // Maps `path`. With no dtype given, reads it from meta.json in the same directory.
  // Throws (naming the path and the numbers) if the file is missing, empty, or its size is not a
  // multiple of the element size.
  static TokenFile open(const std::string& path, std::optional<TokenDType> dtype = std::nullopt);

  int64_t size() const { return size_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }

  // Token i (0 <= i < size()); unchecked, for the batch loops.
  uint32_t operator[](int64_t i) const {
    return dtype_ == TokenDType::U16 ? static_cast<const uint16_t*>(data_)[i]
                                     : static_cast<const uint32_t*>(data_)[i];
  }
  // Copies tokens [begin, begin + n) into out as int32 (checked range).
  void copy_to(int64_t begin, int64_t n, int32_t* out) const;
  // The largest token id in the file (a full scan); to check a file against a model's vocab_size.
  uint32_t max_token() const;

 private:
  std::shared_ptr<void> mapping_;  // munmaps when the last copy goes
  const void* data_ = nullptr;
  int64_t size_ = 0;
  TokenDType dtype_ = TokenDType::U16;
  std::string path_;
};

}  // namespace loom::data
