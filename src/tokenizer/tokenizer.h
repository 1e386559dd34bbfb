// A byte-level BPE tokenizer: vocabulary, merges and special tokens, with encode and decode.
//
// Semantics (GPT-2's, as in OpenAI's encoder.py, Hugging Face's BPE model and CS336):
//   - text is cut into pieces (see pretokenizer.h): special tokens first, then GPT-2's regex;
//   - inside a piece, start from one token per byte and repeatedly apply the merge of lowest rank among
//     adjacent pairs (the leftmost on ties) until no adjacent pair is a merge;
//   - a special token becomes its own id and never takes part in a merge;
//   - a byte the vocabulary has no token for (real vocabularies, SmolLM2's among them, lack a few
//     control bytes) is handled as Hugging Face tokenizers' BPE model handles a character missing from
//     its vocabulary: it becomes the unknown token when the tokenizer has one (a run of such bytes one
//     unknown token when `fuse_unknown`), and is otherwise dropped. Either way the remaining symbols of
//     the piece still merge with each other.
// Ids are whatever the vocabulary says; a trained tokenizer numbers the special tokens first, then
// the 256 bytes, then the merges in the order they were learned.
//
// Thread safety: a Tokenizer is read-only after construction (add_special_token aside), so any number
// of threads may encode and decode with one. Each encode call keeps its own pre-token cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace loom::tokenizer {

using TokenId = uint32_t;

struct EncodeOptions {
  // Worker threads for encoding a stream; 0 takes every core. 1 encodes on the calling thread only and
  // starts no thread at all.
  int threads = 0;
  // Text handed to a worker at a time. Memory in flight is about 2 * threads * chunk_bytes of text
  // plus its ids.
  size_t chunk_bytes = size_t{1} << 20;
};

// Receives the ids of consecutive parts of the text, in order.
using TokenSink = std::function<void(std::span<const TokenId>)>;

class Tokenizer {
 public:
  // vocab[id] is the token's bytes. merges[rank] = (left, right): its result is the token whose bytes
  // are left's then right's, which must be in the vocabulary. special_tokens are token texts that must
  // also be in the vocabulary. Throws loom::Error naming what is inconsistent.
  Tokenizer(std::vector<std::string> vocab, std::vector<std::pair<TokenId, TokenId>> merges,
            std::vector<std::string> special_tokens);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  size_t vocab_size() const { return vocab_.size(); }
  const std::vector<std::string>& vocab() const { return vocab_; }
  const std::string& token_bytes(TokenId id) const;
  std::optional<TokenId> token_id(std::string_view bytes) const;
  const std::vector<std::pair<TokenId, TokenId>>& merges() const { return merges_; }
  const std::vector<std::string>& special_tokens() const { return special_tokens_; }
  std::optional<TokenId> special_token_id(std::string_view text) const;
  bool is_special(TokenId id) const;

  // Makes an existing vocabulary entry a special token (no-op if it already is one).
  void add_special_token(const std::string& text);

  // The unknown token (HF tokenizer.json's model.unk_token), used for bytes without a token of their own.
  void set_unknown_token(std::optional<TokenId> id, bool fuse);
  std::optional<TokenId> unknown_token() const { return unk_; }
  bool fuse_unknown() const { return fuse_unk_; }
  // Bytes the vocabulary has no single-byte token for, ascending.
  std::vector<uint8_t> missing_bytes() const;

  // Encodes on the calling thread.
  std::vector<TokenId> encode(std::string_view text) const;
  // Encodes with no special-token matching: "<|im_start|>" in the text is plain bytes, as when a chat
  // renders a user's message between control tokens it adds itself.
  std::vector<TokenId> encode_ordinary(std::string_view text) const;
  // Encodes a large text on options.threads threads, in chunks cut where pre-tokens end, so the ids are
  // exactly encode(text)'s.
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options) const;
  // Encodes a stream of any length in bounded memory: `sink` gets the ids part by part, in order. The
  // concatenation equals encode() of the whole stream.
  void encode_stream(const ReadFn& read, const TokenSink& sink, const EncodeOptions& options = {}) const;
  void encode_stream(std::istream& in, const TokenSink& sink, const EncodeOptions& options = {}) const;

  // The tokens' bytes, concatenated (may be invalid UTF-8). Throws on an id outside the vocabulary.
  std::string decode_bytes(std::span<const TokenId> ids) const;
  // The text: decode_bytes with each invalid UTF-8 sequence replaced by U+FFFD (Python's
  // errors="replace": one U+FFFD per maximal invalid subpart).
  std::string decode(std::span<const TokenId> ids) const;

  // The BPE of one pre-token on its own (no regex, no special tokens); appends to `out`.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;

  const PreTokenizer& pre_tokenizer() const { return *pre_; }
  const SpecialTokenMatcher& special_matcher() const { return specials_; }

  struct Scratch;  // per-thread state: regex match data, pre-token cache

 private:
  void encode_into(std::string_view text, std::vector<TokenId>& out, Scratch& scratch) const;
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out, Scratch& scratch) const;
  void bpe(std::string_view piece, std::vector<TokenId>& out, Scratch& scratch) const;
  // The symbols BPE starts from: one per byte, with missing bytes handled as described above.
  void initial_symbols(std::string_view piece, std::vector<TokenId>& sym) const;
  void rebuild_specials();

  struct MergeTable;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, TokenId> ids_;
  std::vector<std::pair<TokenId, TokenId>> merges_;
  std::unique_ptr<MergeTable> merge_table_;
  std::vector<std::string> special_tokens_;
  std::vector<TokenId> special_ids_;
  std::vector<bool> is_special_;
  SpecialTokenMatcher specials_;
  std::unique_ptr<PreTokenizer> pre_;
  static constexpr TokenId kNoToken = std::numeric_limits<TokenId>::max();
  TokenId byte_ids_[256];  // kNoToken for a byte without a token
  bool all_bytes_ = true;
  std::optional<TokenId> unk_;
  bool fuse_unk_ = false;
};

// Replaces invalid UTF-8 with U+FFFD, one per maximal invalid subpart (Unicode's recommended practice,
// which Python's decode(errors="replace") follows).
std::string replace_invalid_utf8(std::string_view bytes);

}  // namespace loom::tokenizer
