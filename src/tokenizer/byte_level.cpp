#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

namespace loom::tokenizer {
namespace {

// The table is a pure function of the byte, built once (read-only afterwards).
struct ByteLevelTable {
  std::array<uint32_t, 256> code_point{};  // byte -> character
  std::array<int16_t, 324> byte_of{};      // character (all < 324) -> byte, -1 when not in the alphabet

  ByteLevelTable() {
    byte_of.fill(-1);
    // Printable bytes keep their own code point; the other 68 take 256, 257, ... in byte order.
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      code_point[b] = printable(b) ? static_cast<uint32_t>(b) : next++;
      byte_of[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& t = table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    uint32_t cp = t.code_point[b];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {  // all code points are < 0x800: two UTF-8 bytes
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const auto& t = table();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      if (cp < 0x80) return std::nullopt;  // overlong encoding
      i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are all outside the alphabet
    }
    if (cp >= t.byte_of.size() || t.byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of[cp]));
  }
  return out;
}

}  // namespace loom::tokenizer
