// JSON with limits, and short quotes of JSON for messages: see json.h for why.
// Depends on core/error.h and nlohmann only, so that the fuzz targets (fuzz/) can build it on its own.
#include "io/json.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace loom::io {
namespace {

using json = nlohmann::json;

// The length of the longest prefix of s[0, n) that ends on a UTF-8 character boundary (a cut there
// splits no character; invalid UTF-8 is cut anywhere).
size_t utf8_floor(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  size_t cut = n;
  for (int back = 0; back < 3 && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80; ++back) --cut;
  return (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80 ? n : cut;
}

// Appends s as a JSON string, but only about as much of it as `out` still has room for.
void append_string(std::string_view s, std::string& out, size_t limit) {
  const size_t room = limit >= out.size() ? limit - out.size() + 1 : 1;
  // dump() with replacement, not a throw, should the cut or the string itself not be valid UTF-8.
  out += json(std::string(s.substr(0, utf8_floor(s, room)))).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Writes v into `out` until `out` passes `limit` characters. Recursion: one level per character
// written at most, so never deeper than `limit`.
void append_brief(const json& v, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (v.is_object()) {
    out += '{';
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (it != v.begin()) out += ',';
      append_string(it.key(), out, limit);
      out += ':';
      append_brief(it.value(), out, limit);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (it != v.begin()) out += ',';
      append_brief(*it, out, limit);
    }
    out += ']';
  } else if (v.is_string()) {
    append_string(v.get_ref<const std::string&>(), out, limit);
  } else if (v.is_binary()) {
    out += str("<", v.get_binary().size(), " bytes of binary>");
  } else {
    out += v.dump();  // a number, true, false or null: short
  }
}

}  // namespace

void check_json_limits(std::string_view text, std::string_view what, const JsonLimits& limits) {
  LOOM_CHECK(text.size() <= limits.max_bytes, what, " is ", text.size(), " bytes, over loom's limit of ",
             limits.max_bytes, " bytes for this kind of JSON");
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, which may be '"'
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      LOOM_CHECK(++depth <= limits.max_depth, what, " nests JSON arrays/objects more than ", limits.max_depth,
                 " levels deep (at byte offset ", i, "); loom reads at most ", limits.max_depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;  // unbalanced brackets are the parser's to report
    }
  }
}

json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  check_json_limits(text, what, limits);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    LOOM_FAIL(what, " is not valid JSON: ", brief_parse_error(e.what()));
  }
}

json try_parse_json(std::string_view text, const JsonLimits& limits) {
  try {
    check_json_limits(text, "", limits);
  } catch (const Error&) {
    return json(json::value_t::discarded);
  }
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

json read_json_file(const std::string& path, std::string_view what, const JsonLimits& limits) {
  namespace fs = std::filesystem;
  const std::string name = what.empty() ? path : str(what, ": ", path);
  std::error_code ec;
  const std::string prefix = what.empty() ? "" : str(what, ": ");
  if (fs::is_directory(path, ec)) throw IoError(str(prefix, "cannot read ", path, ": it is a directory"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str(prefix, "cannot open ", path, ": ", std::strerror(errno)));
  const auto size = fs::file_size(path, ec);
  LOOM_CHECK(ec || size <= limits.max_bytes, name, " is ", size, " bytes, over loom's limit of ", limits.max_bytes,
             " bytes for this kind of JSON");
  // Read in pieces, so that a pipe or a file still growing cannot make us hold more than the limit.
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    LOOM_CHECK(text.size() <= limits.max_bytes, name, " is more than ", limits.max_bytes,
               " bytes, over loom's limit for this kind of JSON");
  }
  if (in.bad()) throw IoError(str(name, ": read error"));
  return parse_json(text, name, limits);
}

std::string brief_json(const json& value, size_t max_chars) {
  std::string out;
  append_brief(value, out, max_chars);
  if (out.size() <= max_chars) return out;
  out.resize(utf8_floor(out, max_chars));
  return out + "...";
}

// nlohmann's parse errors end with "last read: '<token>'", and a token can be the rest of the file (an
// unterminated string): keep its start only.
std::string brief_parse_error(const std::string& message) {
  const std::string marker = "last read: '";
  const size_t at = message.find(marker);
  if (at == std::string::npos) return brief_text(message, 300);
  const size_t begin = at + marker.size();
  size_t end = message.find("'; expected", begin);
  if (end == std::string::npos) end = message.rfind('\'');
  if (end == std::string::npos || end < begin) end = message.size();
  return message.substr(0, begin) + brief_text(std::string_view(message).substr(begin, end - begin), 40) +
         message.substr(end);
}

std::string brief_text(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return str(text.substr(0, utf8_floor(text, max_chars)), "... (", text.size(), " bytes)");
}

}  // namespace loom::io
