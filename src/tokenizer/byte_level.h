// GPT-2's byte-level alphabet: each of the 256 bytes is written as one printable Unicode character, so
// that vocab.json / merges.txt / tokenizer.json can store byte strings as text (space -> "Ġ", newline
// -> "Ċ", printable ASCII and most of Latin-1 map to themselves). Source: `bytes_to_unicode` in
// OpenAI's gpt-2/src/encoder.py, which Hugging Face's ByteLevel pre-tokenizer copies.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace loom::tokenizer {

// Bytes -> their byte-level text (UTF-8 of the mapped characters).
std::string bytes_to_byte_level(std::string_view bytes);

// Byte-level text -> bytes; std::nullopt when `text` holds a character outside the 256-character
// alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace loom::tokenizer
