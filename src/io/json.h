// Every JSON text loom reads goes through here: configs, tokenizer files, safetensors headers, Hugging
// Face config.json, run state and manifests. Two limits are checked before nlohmann sees the text:
//
//   * size: a config is kilobytes, a tokenizer tens of megabytes; a file far past that is a mistake (or
//     an attack), and nlohmann's DOM takes about ten times the text's size in memory;
//   * nesting depth: nlohmann's parser is iterative, but copying, comparing and dump()ing a value recurse
//     once per level, so a value nested ~70,000 deep overflowed the stack (a segfault in `train`,
//     `inspect`, `generate`) as soon as an error message quoted it. No file loom reads nests past ~6.
//
// The depth check is a scan of brackets outside strings, so it holds for any parser that runs after it
// (DOM, SAX, callback). Errors are loom::Error naming the file (`what`), the limit and the byte offset.
//
// Values and texts quoted in error messages go through brief_json / brief_text, which write at most a
// short prefix: a message never carries a whole (possibly huge) value.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace loom::io {

struct JsonLimits {
  size_t max_depth = 64;                // arrays and objects open at once
  size_t max_bytes = size_t{16} << 20;  // the text's length
};

// Tokenizer files (tokenizer.json, vocab.json): the largest published ones are a few tens of MB.
inline constexpr JsonLimits kTokenizerJsonLimits{64, size_t{256} << 20};

// Throws loom::Error if `text` is longer than limits.max_bytes or opens more than limits.max_depth
// arrays/objects at once. Says nothing about whether the text is valid JSON otherwise.
void check_json_limits(std::string_view text, std::string_view what, const JsonLimits& limits = {});

// The parsed text. Throws loom::Error "<what> is not valid JSON: ..." (nlohmann's reason, its quoted
// token cut short) or a limit's error.
nlohmann::json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits = {});

// As parse_json, but a discarded value (is_discarded()) instead of a throw, as nlohmann's own
// parse(text, nullptr, false) returns: for readers that treat a bad file as absent.
nlohmann::json try_parse_json(std::string_view text, const JsonLimits& limits = {});

// Reads and parses a file, refusing one past limits.max_bytes before reading it. A file that cannot be
// opened is a loom::IoError "<what>: cannot open <path>: <reason>".
nlohmann::json read_json_file(const std::string& path, std::string_view what, const JsonLimits& limits = {});

// For messages: the value in compact JSON, cut after max_chars characters (at a UTF-8 boundary) with
// "..." appended. Never serializes more than it shows, whatever the value's size or depth.
std::string brief_json(const nlohmann::json& value, size_t max_chars = 80);
// For messages: nlohmann's exception message with its "last read: '<token>'" cut short (the token can
// be the rest of a file, after an unterminated string).
std::string brief_parse_error(const std::string& message);
// For messages: `text` itself (not quoted), cut the same way, with its full length appended when cut.
std::string brief_text(std::string_view text, size_t max_chars = 80);

}  // namespace loom::io
