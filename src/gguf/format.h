// The GGUF container (llama.cpp's model file), on bytes only: parsing with full validation, and the
// writer's layout. No loom::Tensor here, so that the fuzz target (fuzz/gguf_fuzz.cpp) builds this file
// with src/quant on their own.
//
// A file is (all little-endian):
//   "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count metadata entries:  string key, u32 value type, value
//   tensor_count tensor infos:  string name, u32 n_dims, u64 ne[n_dims] (innermost first), u32 ggml type,
//                               u64 offset (into the data section)
//   padding to `alignment`, then the data section: each tensor's bytes at its offset, padded to
//   `alignment`.
// A string is u64 length + bytes (no terminator). An array value is u32 element type, u64 count, then
// the elements (arrays of arrays allowed). `alignment` is metadata "general.alignment" (u32), else 32.
//
// The reader's rules (every violation a loom::Error naming the value and where it is):
//   * magic "GGUF"; version 3 (or 2, whose layout is identical; 1 used 32-bit counts and is refused,
//     and a big-endian file shows up as a version like 50331648 and is refused as such);
//   * every length, count and offset is checked against the bytes left before it is used, with
//     overflow-checked arithmetic, so no read goes past the end and no allocation is larger than the
//     file could describe;
//   * keys are non-empty valid UTF-8 of at most 65,535 bytes, unique; tensor names valid UTF-8 of at
//     most 64 bytes (ggml's GGML_MAX_NAME), unique;
//   * value types 0..12; a bool is 0 or 1; arrays nest at most kMaxArrayDepth deep;
//   * general.alignment, when present, is a u32 power of two;
//   * 1 to 4 dimensions (ggml's GGML_MAX_DIMS), each >= 1, ne[0] a multiple of the type's block size,
//     element and byte counts without overflow; types are those src/quant knows (others refused by
//     name, quant::quant_type_from_id);
//   * tensors are laid out as llama.cpp requires: the first at offset 0, each next one at the previous
//     one's end rounded up to `alignment` (so none overlaps and none leaves a gap), and the last one ends
//     inside the file; after it at most the alignment padding may follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "quant/quant.h"

namespace loom::gguf {

// GGUF's metadata value types; the values are the file's type ids.
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType type);  // "u32", "string", "array", ...

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxArrayDepth = 8;
inline constexpr size_t kMaxKeyBytes = 65535;
inline constexpr size_t kMaxTensorNameBytes = 64;
inline constexpr int kMaxDims = 4;

struct Value;

// An array value. Numbers and bools are kept as their little-endian bytes (`raw`, count * element size),
// so a large numeric array costs what it costs in the file; strings and nested arrays are `items`.
struct Array {
  ValueType element = ValueType::U8;
  uint64_t count = 0;
  std::string raw;           // numeric/bool elements
  std::vector<Value> items;  // string or array elements

  // Element i as an integer (any integer type or bool), a float (F32/F64), or a string; throws naming
  // the element type when it is not one.
  int64_t integer(uint64_t i) const;
  double number(uint64_t i) const;
  const std::string& string(uint64_t i) const;
};

// A metadata value. The variant's index is the GGUF type id (ValueType), so type() is free.
struct Value {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string, Array, uint64_t,
               int64_t, double>
      v;

  ValueType type() const { return static_cast<ValueType>(v.index()); }
  bool is_integer() const;  // U8..I64 (not bool)
  // The value's description for messages: "u32 3", "string \"llama\"", "array of 49152 string".
  std::string describe() const;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  quant::QuantType type = quant::QuantType::F32;
  uint64_t offset = 0;  // into the data section
  uint64_t nbytes = 0;
  uint64_t numel() const;  // checked not to overflow when parsed
};

struct Header {
  uint32_t version = 3;
  uint32_t alignment = kDefaultAlignment;
  std::vector<KeyValue> metadata;  // in file order
  std::vector<TensorInfo> tensors; // in file order (which is offset order)
  uint64_t data_start = 0;         // offset of the data section in the file
  uint64_t data_bytes = 0;         // the end of the last tensor, relative to data_start

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed reads of a metadata key; each throws naming the key and what it holds when it is absent or
  // of another kind. uint accepts any integer type holding a non-negative value; number any integer or
  // float type.
  uint64_t get_uint(std::string_view key) const;
  double get_number(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Array& get_array(std::string_view key) const;

  std::unordered_map<std::string, size_t> key_index;     // key -> position in metadata
  std::unordered_map<std::string, size_t> tensor_index;  // name -> position in tensors
};

// Parses and validates a whole GGUF file held in memory (`size` is the whole file's size).
Header parse_gguf(const uint8_t* data, size_t size);

// ---- writing --------------------------------------------------------------------------------------

struct TensorEntry {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order (innermost first)
  quant::QuantType type = quant::QuantType::F32;
  const void* data = nullptr;
  uint64_t nbytes = 0;  // must be what ne and type imply
};

// Receives the file's bytes in order.
using ByteSink = std::function<void(const void* data, size_t bytes)>;

// Writes a GGUF v3 file to `sink`: the metadata in the given order (general.alignment, if given, must
// be a u32 power of two and sets the alignment), then the tensors in the given order, each at the next
// aligned offset. Validates what the reader would refuse (names, sizes, duplicate keys) first, so a
// refused input writes nothing. Returns the number of bytes written.
uint64_t write_gguf(const ByteSink& sink, const std::vector<KeyValue>& metadata, const std::vector<TensorEntry>& tensors);
// The whole file in memory (tests, the fuzz target).
std::vector<uint8_t> serialize_gguf(const std::vector<KeyValue>& metadata, const std::vector<TensorEntry>& tensors);

// Metadata values, for writers.
Value string_array(const std::vector<std::string>& items);
template <typename T>
Value numeric_array(ValueType element, const std::vector<T>& items) {
  Array a;
  a.element = element;
  a.count = items.size();
  a.raw.assign(reinterpret_cast<const char*>(items.data()), items.size() * sizeof(T));
  return Value{std::move(a)};
}

// A name or key as it appears in messages: quoted, control bytes escaped, cut after 100 characters.
std::string quoted(std::string_view text);

}  // namespace loom::gguf
