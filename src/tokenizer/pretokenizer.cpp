#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>
#include <istream>

#include "core/error.h"

namespace loom::tokenizer {

// ---- special tokens --------------------------------------------------------------------------------

SpecialTokenMatcher::SpecialTokenMatcher(const std::vector<std::string>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOOM_CHECK(!tokens[i].empty(), "special token ", i, " is empty");
    tokens_.push_back({tokens[i], i});
    first_byte_[static_cast<unsigned char>(tokens[i][0])] = true;
    max_length_ = std::max(max_length_, tokens[i].size());
  }
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const Entry& a, const Entry& b) { return a.text.size() > b.text.size(); });
}

std::optional<SpecialTokenMatcher::Match> SpecialTokenMatcher::find(std::string_view text, size_t from) const {
  if (tokens_.empty()) return std::nullopt;
  const char* data = text.data();
  const size_t n = text.size();
  for (size_t i = from; i < n; ++i) {
    if (!first_byte_[static_cast<unsigned char>(data[i])]) continue;
    for (const Entry& e : tokens_) {  // longest first
      if (e.text.size() <= n - i && std::memcmp(data + i, e.text.data(), e.text.size()) == 0) {
        return Match{i, e.text.size(), e.index};
      }
    }
  }
  return std::nullopt;
}

bool SpecialTokenMatcher::spans(std::string_view text, size_t p) const {
  for (const Entry& e : tokens_) {
    const size_t len = e.text.size();
    const size_t first = p >= len - 1 ? p - (len - 1) : 0;
    for (size_t s = first; s < p; ++s) {
      if (s + len <= text.size() && std::memcmp(text.data() + s, e.text.data(), len) == 0) return true;
    }
  }
  return false;
}

// ---- UTF-8 -----------------------------------------------------------------------------------------

namespace {
// Length of the valid character starting at s[0], or 0 when none starts there (RFC 3629: no overlongs,
// no surrogates, nothing above U+10FFFF).
size_t utf8_char_length(const unsigned char* s, size_t n) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  auto cont = [&](size_t k) { return k < n && (s[k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (n < 2) return 0;
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return s[1] >= lo && s[1] <= hi && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (n < 2) return 0;
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return s[1] >= lo && s[1] <= hi && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}
}  // namespace

size_t valid_utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    size_t len = utf8_char_length(p + i, n - i);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

size_t invalid_utf8_run(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size() && utf8_char_length(p + i, s.size() - i) == 0) ++i;
  return std::max<size_t>(i, 1);
}

// ---- the GPT-2 regex -------------------------------------------------------------------------------

namespace {
// Unicode's White_Space property (= `\s` in tiktoken's Rust regex).
#define LOOM_WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" LOOM_WS "\\p{L}\\p{N}]+|[" LOOM_WS "]+(?![^" LOOM_WS
    "])|[" LOOM_WS "]+";
#undef LOOM_WS
}  // namespace

PreTokenizer::PreTokenizer() {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    LOOM_ASSERT(false, "GPT-2 regex does not compile at offset ", offset, ": ", reinterpret_cast<char*>(message));
  }
  // JIT is a large speed-up; without it (an exotic platform) pcre2_match still works.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

PreTokenizer::~PreTokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

PreTokenizer::MatchData::MatchData(const PreTokenizer& pre) {
  data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(pre.code_), nullptr);
  LOOM_ASSERT(data_ != nullptr, "out of memory creating PCRE2 match data");
}

PreTokenizer::MatchData::~MatchData() { pcre2_match_data_free(static_cast<pcre2_match_data*>(data_)); }

size_t PreTokenizer::match_end(std::string_view text, size_t pos, MatchData& md) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* data = static_cast<pcre2_match_data*>(md.data_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Compiled anchored: every character is matched by some alternative, so the pieces tile the text.
  int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, data, nullptr)
                : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data, nullptr);
  LOOM_ASSERT(rc > 0, "GPT-2 regex found no pre-token at byte ", pos, " (pcre2 rc ", rc, ")");
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
  LOOM_ASSERT(ov[0] == pos && ov[1] > pos, "GPT-2 regex matched an empty or unanchored piece at byte ", pos);
  return ov[1];
}

// ---- cutting a long text into independent chunks ---------------------------------------------------

namespace {
bool ascii_letter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
bool ascii_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Whether the GPT-2 regex ends a piece between s[p-1] and s[p], and cutting there leaves every
// piece before p unchanged, whatever comes before or after (p >= 2):
//   - after an ASCII letter, unless a letter follows: the only alternatives that take letters
//     (` ?\p{L}+` and the contractions 's 't ...) end with letters and take nothing else;
//   - after an ASCII digit, unless a digit follows (same argument with ` ?\p{N}+`);
//   - after a lone \t \n \v \f \r (an ASCII non-space before it) when a non-space ASCII character
//     follows. A longer whitespace run would not do: `\s+(?!\S)` leaves the run's last character for
//     the next piece when text follows, but takes the whole run at the end of a chunk.
// Whether the piece's last character is White_Space (the set kGpt2Pattern spells out).
bool ends_with_whitespace(std::string_view piece) {
  if (piece.empty()) return false;
  size_t i = piece.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(piece[i]) & 0xC0) == 0x80) --i;
  const auto* s = reinterpret_cast<const unsigned char*>(piece.data() + i);
  const size_t len = piece.size() - i;
  uint32_t cp = s[0];
  if (len == 2) cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
  if (len == 3) cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
  if (len >= 4) return false;  // no White_Space character is above U+FFFF
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool regex_boundary(const unsigned char* s, size_t p) {
  const unsigned char a = s[p - 1], b = s[p];
  if (b >= 0x80) return false;
  if (ascii_letter(a)) return !ascii_letter(b);
  if (ascii_digit(a)) return !ascii_digit(b);
  if (a != ' ' && ascii_space(a)) return !ascii_space(b) && s[p - 2] < 0x80 && !ascii_space(s[p - 2]);
  return false;
}
}  // namespace

size_t find_split_point(std::string_view buffer, const SpecialTokenMatcher& specials, const PreTokenizer& pre,
                        PreTokenizer::MatchData& md) {
  const size_t n = buffer.size();
  // Room after p to see any special token that could span it, or start there and run past the end.
  const size_t margin = std::max<size_t>(specials.max_length(), 4);
  if (n <= margin + 1) return 0;
  const size_t hi = n - margin;
  const auto* s = reinterpret_cast<const unsigned char*>(buffer.data());
  for (size_t p = hi; p >= std::max<size_t>(2, n / 2); --p) {
    if (regex_boundary(s, p) && !specials.spans(buffer, p)) return p;
  }
  // Rare (e.g. long runs of CJK text): take the regex's own pieces. A piece [a, b) whose next piece
  // ends at c with c + 4 <= n was decided without looking past the buffer (the regex looks at most
  // 3 characters ahead of a piece's start or 1 past a whitespace run), so b is a true boundary. The
  // piece before b must not be whitespace: `\s+(?!\S)` would take a longer run at a chunk's end.
  size_t best = 0;
  size_t from = 0;
  while (from < n) {
    auto special = specials.find(buffer, from);
    const size_t seg_end = special ? special->begin : n;
    std::string_view segment = buffer.substr(from, seg_end - from);
    size_t prev_end = 0;
    bool prev_ok = false;  // a previous piece exists and is not whitespace
    pre.for_each(segment, md, [&](std::string_view piece) {
      const size_t begin = static_cast<size_t>(piece.data() - segment.data());
      const size_t end = begin + piece.size();
      if (prev_ok && from + end + 4 <= n && from + prev_end <= hi && !specials.spans(buffer, from + prev_end)) {
        best = from + prev_end;
      }
      prev_end = end;
      prev_ok = !ends_with_whitespace(piece);
    });
    if (!special) break;
    if (special->begin > 0 && special->begin <= hi && !specials.spans(buffer, special->begin)) best = special->begin;
    from = special->begin + special->length;
  }
  return best;
}

}  // namespace loom::tokenizer

namespace loom::tokenizer {

ReadFn read_from(std::string_view text) {
  auto at = std::make_shared<size_t>(0);
  return [text, at](char* dst, size_t n) {
    const size_t k = std::min(n, text.size() - *at);
    std::memcpy(dst, text.data() + *at, k);
    *at += k;
    return k;
  };
}

ReadFn read_from(std::istream& in, std::string error) {
  return [&in, error = std::move(error)](char* dst, size_t n) -> size_t {
    in.read(dst, static_cast<std::streamsize>(n));
    if (in.bad()) throw IoError(error);
    return static_cast<size_t>(in.gcount());
  };
}

TextChunker::TextChunker(ReadFn read, const SpecialTokenMatcher& specials, const PreTokenizer& pre, size_t chunk_bytes)
    : read_(std::move(read)), specials_(specials), pre_(pre), match_(pre), chunk_bytes_(chunk_bytes) {
  LOOM_CHECK(chunk_bytes >= 64, "chunk size must be at least 64 bytes, got ", chunk_bytes);
}

void TextChunker::fill(std::string& buf, size_t want) {
  while (!at_end_ && buf.size() < want) {
    const size_t old = buf.size();
    buf.resize(want);
    const size_t got = read_(buf.data() + old, want - old);
    buf.resize(old + got);
    bytes_read_ += got;
    if (got == 0) at_end_ = true;
  }
}

bool TextChunker::next(std::string& chunk) {
  chunk.swap(carry_);
  carry_.clear();
  size_t want = std::max(chunk_bytes_, chunk.size());
  fill(chunk, want);
  if (chunk.empty()) return false;
  size_t cut = at_end_ ? chunk.size() : find_split_point(chunk, specials_, pre_, match_);
  while (cut == 0 && !at_end_) {
    want *= 2;
    fill(chunk, want);
    cut = at_end_ ? chunk.size() : find_split_point(chunk, specials_, pre_, match_);
  }
  carry_.assign(chunk, cut, std::string::npos);
  chunk.resize(cut);
  return true;
}

}  // namespace loom::tokenizer
