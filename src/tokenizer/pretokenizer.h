// Pre-tokenization: how text is cut into pieces before BPE runs inside each piece.
//
//   1. Special tokens are cut out first (SpecialTokenMatcher): the leftmost occurrence wins and, among
//      occurrences that start at the same byte, the longest. No merge ever crosses a special token.
//   2. The text between special tokens is cut by GPT-2's regex (PreTokenizer), compiled by PCRE2 with
//      UTF + UCP and JIT:
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      `\s` is spelled out as Unicode's White_Space set, which is what tiktoken's Rust regex means by
//      `\s` (PCRE2's own `\s` with UCP also takes U+180E).
//   3. Bytes that are not valid UTF-8 cannot go through the regex; each maximal run of them becomes a
//      piece of its own, so any byte string still encodes and decodes back exactly.
//
// Chunking (find_split_point) lets training and streaming encoding cut a large text into pieces that
// are processed independently (on several threads) yet give exactly the pieces of the whole text.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::tokenizer {

class SpecialTokenMatcher {
 public:
  SpecialTokenMatcher() = default;
  explicit SpecialTokenMatcher(const std::vector<std::string>& tokens);

  struct Match {
    size_t begin = 0;
    size_t length = 0;
    size_t index = 0;  // index into the tokens given to the constructor
  };
  // The leftmost occurrence at or after `from`; the longest one among those starting there.
  std::optional<Match> find(std::string_view text, size_t from) const;
  // True when an occurrence of some token starts before `p` and ends after it (s < p < s + len), i.e.
  // cutting the text at `p` could change which special tokens are found.
  bool spans(std::string_view text, size_t p) const;
  bool empty() const { return tokens_.empty(); }
  size_t max_length() const { return max_length_; }

 private:
  struct Entry {
    std::string text;
    size_t index;
  };
  std::vector<Entry> tokens_;  // longest first, so the first hit at a position is the longest
  std::array<bool, 256> first_byte_{};
  size_t max_length_ = 0;
};

// Length of the longest prefix of `s` that is valid UTF-8 (whole characters only).
size_t valid_utf8_prefix(std::string_view s);
// Length of the invalid stretch at the start of `s` (s must start with an invalid sequence): bytes up
// to the next position where a valid character starts.
size_t invalid_utf8_run(std::string_view s);

// GPT-2's pre-tokenizer regex. One compiled pattern is shared (read-only) by all threads; each thread
// brings its own MatchData.
class PreTokenizer {
 public:
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  class MatchData {
   public:
    explicit MatchData(const PreTokenizer& pre);
    ~MatchData();
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;

   private:
    friend class PreTokenizer;
    void* data_;  // pcre2_match_data*
  };

  // Calls fn(piece) for each pre-token of `text`, which must not contain special tokens (cut them
  // out first). Invalid UTF-8 runs come out as pieces of their own.
  template <typename Fn>
  void for_each(std::string_view text, MatchData& md, Fn&& fn) const {
    size_t pos = 0;
    while (pos < text.size()) {
      // The regex sees only the valid stretch: PCRE2 runs without its own UTF check (which would rescan
      // the rest of the subject on every call).
      std::string_view segment = text.substr(pos, valid_utf8_prefix(text.substr(pos)));
      for (size_t at = 0; at < segment.size();) {
        size_t end = match_end(segment, at, md);
        fn(segment.substr(at, end - at));
        at = end;
      }
      pos += segment.size();
      if (pos < text.size()) {
        size_t bad = invalid_utf8_run(text.substr(pos));
        fn(text.substr(pos, bad));
        pos += bad;
      }
    }
  }

  // End of the pre-token starting at `pos` in valid UTF-8 `text` (pos < text.size()).
  size_t match_end(std::string_view text, size_t pos, MatchData& md) const;

 private:
  void* code_;  // pcre2_code*
  bool jit_ = false;
};

// A place to cut `buffer` (the start of a longer text whose rest is not known yet) such that
// pre-tokenizing buffer[0, p) and the text from p separately gives exactly the pieces of the whole:
// no special token occurrence spans p, and p is a pre-token boundary whatever follows the buffer.
// Returns 0 when the buffer has no such place. Prefers the last such place in the buffer.
size_t find_split_point(std::string_view buffer, const SpecialTokenMatcher& specials, const PreTokenizer& pre,
                        PreTokenizer::MatchData& md);

}  // namespace loom::tokenizer

namespace loom::tokenizer {

// Reads up to `n` bytes into `dst`, returns how many (0 at the end).
using ReadFn = std::function<size_t(char* dst, size_t n)>;
// The bytes of `text`, which must outlive the reader.
ReadFn read_from(std::string_view text);
// The bytes of `in`, which must outlive the reader; a read error throws IoError(`error`).
ReadFn read_from(std::istream& in, std::string error);

// Cuts a stream into chunks of about `chunk_bytes` at places find_split_point accepts, so that each
// chunk can be pre-tokenized on its own. A chunk grows past chunk_bytes only while no such place has
// been seen (one pre-token longer than the chunk).
class TextChunker {
 public:
  TextChunker(ReadFn read, const SpecialTokenMatcher& specials, const PreTokenizer& pre, size_t chunk_bytes);
  // The next chunk into `chunk` (replacing its contents); false at the end of the stream.
  bool next(std::string& chunk);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  void fill(std::string& buf, size_t want);
  ReadFn read_;
  const SpecialTokenMatcher& specials_;
  const PreTokenizer& pre_;
  PreTokenizer::MatchData match_;
  size_t chunk_bytes_;
  std::string carry_;  // read but not handed out yet: it may end inside a pre-token
  bool at_end_ = false;
  uint64_t bytes_read_ = 0;
};

}  // namespace loom::tokenizer
