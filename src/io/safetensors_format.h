// The safetensors format, on bytes only: dtypes, header parsing with full validation, and the writer's
// layout. No loom::Tensor here, so that the fuzz target (fuzz/) can build this file on its own.
//
// A file is: 8 bytes N (little-endian u64), N bytes of UTF-8 JSON (the header), then the data section.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section), plus an optional "__metadata__": {string: string}.
//
// The reader enforces the reference implementation's rules (huggingface/safetensors, tensor.rs), and a
// few stricter ones where the reference is lax or where nlohmann::json differs from serde_json:
//   * N <= 100,000,000 and 8 + N <= file size;
//   * the header is valid UTF-8 (overlongs, surrogates and code points past U+10FFFF are invalid), has
//     no NUL byte (nlohmann stops at NUL, serde_json does not), starts with '{' (the reference's
//     planned InvalidHeaderStart rule; it also rules out a BOM, which nlohmann skips and serde rejects);
//   * the header is one JSON object, possibly followed by whitespace (the writer pads with spaces),
//     nested at most 64 deep (stricter: serde_json stops at 128; a real header nests 3 deep, and
//     loom's limit is the one every JSON reader shares, io/json.h);
//   * no duplicate keys at any level (stricter: serde_json and nlohmann keep the last duplicate);
//   * each tensor entry has exactly the fields dtype, shape, data_offsets (stricter: the reference
//     ignores unknown fields), a known dtype, non-negative integer dims and offsets;
//   * element count and byte size computed with overflow checks, whole bytes, equal to end - begin;
//   * the offsets, sorted, tile the data section from 0 with no gap and no overlap, and the last one is
//     the end of the file (no trailing bytes, no truncation);
//   * "__metadata__" is null or an object whose values are all strings.
// Every violation throws loom::Error naming the tensor, the offsets and sizes involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::io {

// The reference's dtypes, declared in its order: the order *is* the writer's layout rank (the reference
// writes tensors by descending dtype, then by name, which keeps every tensor aligned for its dtype).
enum class SafetensorsDtype : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

const char* safetensors_dtype_name(SafetensorsDtype dtype);  // "F32"
std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name);
// Bits per element: 4 for F4, 6 for the F6 types, 8 for BOOL (stored as one byte), ...
int safetensors_dtype_bits(SafetensorsDtype dtype);

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // the reference's MAX_HEADER_SIZE
inline constexpr const char* kSafetensorsMetadataKey = "__metadata__";

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<uint64_t> shape;  // outermost first; [] is a scalar (one element)
  uint64_t begin = 0;           // byte offsets into the data section: [begin, end)
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  uint64_t numel() const;  // validated not to overflow when the header was parsed
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N: the JSON text's length, padding included
  uint64_t data_bytes = 0;    // the data section's length (the file size minus 8 + N)
  std::vector<SafetensorsTensorInfo> tensors;  // in file order: sorted by data offset
  bool has_metadata = false;                   // whether "__metadata__" was present (and not null)
  std::map<std::string, std::string> metadata;

  uint64_t data_start() const { return 8 + header_bytes; }  // offset of the data section in the file
  // The tensor named `name`, or null.
  const SafetensorsTensorInfo* find(std::string_view name) const;

  std::unordered_map<std::string, size_t> index;  // name -> position in `tensors`
};

// Parses and validates a whole safetensors file held in memory (`size` is the whole file's size, so that
// the data section's extent can be checked too). Throws loom::Error on any violation of the rules above.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size);

// ---- writing --------------------------------------------------------------------------------------

// One tensor to write: raw little-endian bytes in row-major order.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<uint64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// What the writer puts on disk: the 8-byte length and padded header text, then the entries' bytes in
// `order` (indices into the entries given to plan_safetensors_layout).
struct SafetensorsLayout {
  std::string prefix;          // 8-byte N + header JSON padded with spaces to a multiple of 8
  std::vector<size_t> order;   // entries by descending dtype rank, then name (the reference's order)
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return prefix.size() + data_bytes; }
};

// Validates the entries (unique, valid UTF-8 names that are not "__metadata__"; byte sizes that match
// dtype and shape) and lays them out as the reference writer does. `metadata` is written as given (keys
// sorted); callers that want {"format": "pt"} add it (write_safetensors does).
SafetensorsLayout plan_safetensors_layout(const std::vector<SafetensorsEntry>& entries,
                                          const std::map<std::string, std::string>& metadata);

// The whole file in memory (tests, the fuzz target's round trip).
std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata);

// ---- helpers shared with the reader of loom tensors -----------------------------------------------

// Where the UTF-8 in [data, data+size) first goes wrong, or nullopt if it is valid.
std::optional<size_t> find_invalid_utf8(const uint8_t* data, size_t size);
// A name as it appears in messages: JSON-quoted, control bytes escaped, cut after 100 characters.
std::string quote_name(std::string_view name);
// The shape as "[2, 3]".
std::string shape_string(const std::vector<uint64_t>& shape);

}  // namespace loom::io
