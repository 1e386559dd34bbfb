#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>
#include <thread>


#include "core/error.h"
#include "core/thread_count.h"
#include "io/json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chunk_pipeline.h"

namespace loom::tokenizer {

// ---- merge lookup: (left, right) -> (rank, result) ------------------------------------------------

// Open addressing with linear probing over 64-bit pair keys: the inner loop of encoding is one lookup
// per adjacent pair, and std::unordered_map's node chasing costs about 3x more there.
struct Tokenizer::MergeTable {
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    TokenId result = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t key(TokenId a, TokenId b) { return (uint64_t{a} << 32) | b; }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 1) cap *= 2;
    slots.assign(cap, Slot{});
    mask = cap - 1;
  }
  // Returns false when the pair is already there (a duplicate merge).
  bool insert(TokenId a, TokenId b, uint32_t rank, TokenId result) {
    const uint64_t k = key(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty) {
        slots[i] = {k, rank, result};
        return true;
      }
      if (slots[i].key == k) return false;
    }
  }
  const Slot* find(TokenId a, TokenId b) const {
    const uint64_t k = key(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// ---- per-thread scratch ----------------------------------------------------------------------------

namespace {
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
}  // namespace

struct Tokenizer::Scratch {
  explicit Scratch(const PreTokenizer& pre) : match(pre) {}
  PreTokenizer::MatchData match;
  // Pre-token -> its ids (a span of `cache_ids`). Natural text repeats a small set of pre-tokens, so
  // most pieces skip BPE entirely. Cleared when full, which bounds memory on any input.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<TokenId> cache_ids;
  std::vector<TokenId> symbols;
  std::vector<uint32_t> ranks;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  static constexpr size_t kMaxCachedPiece = 64;
};

// ---- construction ----------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::vector<std::string> vocab, std::vector<std::pair<TokenId, TokenId>> merges,
                     std::vector<std::string> special_tokens)
    : vocab_(std::move(vocab)), merges_(std::move(merges)), pre_(std::make_unique<PreTokenizer>()) {
  LOOM_CHECK(vocab_.size() < std::numeric_limits<TokenId>::max(), "tokenizer: vocabulary of ", vocab_.size(),
             " tokens is too large");
  ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    LOOM_CHECK(!vocab_[id].empty(), "tokenizer: token ", id, " is empty");
    auto [it, inserted] = ids_.emplace(vocab_[id], static_cast<TokenId>(id));
    LOOM_CHECK(inserted, "tokenizer: tokens ", it->second, " and ", id, " are the same bytes \"",
               io::brief_text(bytes_to_byte_level(vocab_[id])), "\"");
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == ids_.end() ? kNoToken : it->second;
    all_bytes_ &= it != ids_.end();
  }
  merge_table_ = std::make_unique<MergeTable>(merges_.size());
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    auto [a, b] = merges_[rank];
    LOOM_CHECK(a < vocab_.size() && b < vocab_.size(), "tokenizer: merge ", rank, " refers to token ",
               std::max(a, b), " but the vocabulary has ", vocab_.size(), " tokens");
    auto it = ids_.find(vocab_[a] + vocab_[b]);
    LOOM_CHECK(it != ids_.end(), "tokenizer: merge ", rank, " (\"", io::brief_text(bytes_to_byte_level(vocab_[a])),
               "\" \"", io::brief_text(bytes_to_byte_level(vocab_[b])),
               "\") makes a token that is not in the vocabulary");
    // A repeated merge can never apply (the first one already took the pair); keep the first.
    merge_table_->insert(a, b, static_cast<uint32_t>(rank), it->second);
  }
  is_special_.assign(vocab_.size(), false);
  for (const std::string& s : special_tokens) add_special_token(s);
  rebuild_specials();
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::add_special_token(const std::string& text) {
  auto id = token_id(text);
  LOOM_CHECK(id.has_value(), "tokenizer: special token (--special-token) \"", io::brief_text(text), "\" is not in the vocabulary");
  if (is_special_[*id]) return;
  is_special_[*id] = true;
  special_tokens_.push_back(text);
  special_ids_.push_back(*id);
  rebuild_specials();
}

void Tokenizer::set_unknown_token(std::optional<TokenId> id, bool fuse) {
  LOOM_CHECK(!id || *id < vocab_.size(), "tokenizer: unknown token id ", id.value_or(0), " is out of range (vocabulary has ",
             vocab_.size(), " tokens)");
  unk_ = id;
  fuse_unk_ = fuse;
}

std::vector<uint8_t> Tokenizer::missing_bytes() const {
  std::vector<uint8_t> out;
  for (int b = 0; b < 256; ++b) {
    if (byte_ids_[b] == kNoToken) out.push_back(static_cast<uint8_t>(b));
  }
  return out;
}

void Tokenizer::initial_symbols(std::string_view piece, std::vector<TokenId>& sym) const {
  sym.clear();
  bool last_unknown = false;
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id != kNoToken) {
      sym.push_back(id);
      last_unknown = false;
    } else if (unk_) {
      if (!(fuse_unk_ && last_unknown)) sym.push_back(*unk_);
      last_unknown = true;
    }
  }
}

void Tokenizer::rebuild_specials() { specials_ = SpecialTokenMatcher(special_tokens_); }

const std::string& Tokenizer::token_bytes(TokenId id) const {
  LOOM_CHECK(id < vocab_.size(), "tokenizer: token id ", id, " is out of range (vocabulary has ", vocab_.size(),
             " tokens)");
  return vocab_[id];
}

std::optional<TokenId> Tokenizer::token_id(std::string_view bytes) const {
  auto it = ids_.find(std::string(bytes));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<TokenId> Tokenizer::special_token_id(std::string_view text) const {
  for (size_t i = 0; i < special_tokens_.size(); ++i) {
    if (special_tokens_[i] == text) return special_ids_[i];
  }
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const { return id < is_special_.size() && is_special_[id]; }

// ---- BPE inside one piece --------------------------------------------------------------------------

void Tokenizer::bpe(std::string_view piece, std::vector<TokenId>& out, Scratch& scratch) const {
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  const MergeTable& table = *merge_table_;
  size_t n = piece.size();
  auto rank_of = [&](TokenId a, TokenId b) {
    const MergeTable::Slot* s = table.find(a, b);
    return s ? s->rank : kNone;
  };
  if (n <= 128) {
    // Short pieces (nearly all): rescan for the lowest rank after each merge, O(n^2) with tiny constants.
    auto& sym = scratch.symbols;
    auto& rank = scratch.ranks;  // rank[i]: the merge of (sym[i], sym[i+1])
    if (all_bytes_) {
      sym.resize(n);
      for (size_t i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    } else {
      initial_symbols(piece, sym);
      n = sym.size();
      if (n == 0) return;
    }
    rank.resize(n);
    for (size_t i = 0; i + 1 < n; ++i) rank[i] = rank_of(sym[i], sym[i + 1]);
    size_t m = n;
    while (m > 1) {
      size_t best = 0;
      uint32_t best_rank = kNone;
      for (size_t i = 0; i + 1 < m; ++i) {
        if (rank[i] < best_rank) {
          best_rank = rank[i];
          best = i;
        }
      }
      if (best_rank == kNone) break;
      sym[best] = table.find(sym[best], sym[best + 1])->result;
      std::memmove(&sym[best + 1], &sym[best + 2], (m - best - 2) * sizeof(TokenId));
      std::memmove(&rank[best + 1], &rank[best + 2], (m - best - 2) * sizeof(uint32_t));
      --m;
      if (best > 0) rank[best - 1] = rank_of(sym[best - 1], sym[best]);
      if (best + 1 < m) rank[best] = rank_of(sym[best], sym[best + 1]);
    }
    out.insert(out.end(), sym.begin(), sym.begin() + static_cast<ptrdiff_t>(m));
    return;
  }
  // Long pieces (runs of spaces, long words): a linked list and a min-heap of (rank, position), with
  // stale heap entries skipped when popped. O(n log n).
  std::vector<TokenId> sym;
  initial_symbols(piece, sym);
  n = sym.size();
  if (n == 0) return;
  std::vector<int64_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
  }
  struct Entry {
    uint32_t rank;
    int64_t pos;
    TokenId left, right;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int64_t i) {
    if (i < 0 || next[i] < 0) return;
    uint32_t r = rank_of(sym[i], sym[next[i]]);
    if (r != kNone) heap.push({r, i, sym[i], sym[next[i]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    const int64_t i = e.pos;
    if (!alive[i] || next[i] < 0 || sym[i] != e.left || sym[next[i]] != e.right) continue;  // stale
    const int64_t j = next[i];
    sym[i] = table.find(e.left, e.right)->result;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int64_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  Scratch scratch(*pre_);
  bpe(piece, out, scratch);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<TokenId>& out, Scratch& scratch) const {
  pre_->for_each(text, scratch.match, [&](std::string_view piece) {
    if (piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] != kNoToken) {
      out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (piece.size() > Scratch::kMaxCachedPiece) {
      bpe(piece, out, scratch);
      return;
    }
    auto it = scratch.cache.find(piece);
    if (it != scratch.cache.end()) {
      const TokenId* ids = scratch.cache_ids.data() + it->second.first;
      out.insert(out.end(), ids, ids + it->second.second);
      return;
    }
    const size_t before = out.size();
    bpe(piece, out, scratch);
    if (scratch.cache.size() >= Scratch::kMaxCacheEntries) {
      scratch.cache.clear();
      scratch.cache_ids.clear();
    }
    const auto offset = static_cast<uint32_t>(scratch.cache_ids.size());
    scratch.cache_ids.insert(scratch.cache_ids.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
    scratch.cache.emplace(std::string(piece), std::make_pair(offset, static_cast<uint32_t>(out.size() - before)));
  });
}

void Tokenizer::encode_into(std::string_view text, std::vector<TokenId>& out, Scratch& scratch) const {
  size_t from = 0;
  while (true) {
    auto special = specials_.find(text, from);
    const size_t end = special ? special->begin : text.size();
    encode_ordinary(text.substr(from, end - from), out, scratch);
    if (!special) break;
    out.push_back(special_ids_[special->index]);
    from = special->begin + special->length;
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  Scratch scratch(*pre_);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 16);
  encode_into(text, out, scratch);
  return out;
}

std::vector<TokenId> Tokenizer::encode_ordinary(std::string_view text) const {
  Scratch scratch(*pre_);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 16);
  encode_ordinary(text, out, scratch);
  return out;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 16);
  encode_stream(read_from(text), [&](std::span<const TokenId> ids) { out.insert(out.end(), ids.begin(), ids.end()); },
                options);
  return out;
}

// ---- streams ---------------------------------------------------------------------------------------

void Tokenizer::encode_stream(const ReadFn& read, const TokenSink& sink, const EncodeOptions& options) const {
  LOOM_CHECK(options.chunk_bytes >= 64, "encode: chunk_bytes must be at least 64, got ", options.chunk_bytes);
  const int threads = resolve_thread_count(options.threads, "encode: threads");
  std::vector<std::unique_ptr<Scratch>> scratch(static_cast<size_t>(threads));
  for (auto& s : scratch) s = std::make_unique<Scratch>(*pre_);
  TextChunker chunker(read, specials_, *pre_, options.chunk_bytes);
  run_chunk_pipeline<std::vector<TokenId>>(
      chunker, threads,
      [&](const std::string& text, int worker) {
        std::vector<TokenId> ids;
        ids.reserve(text.size() / 3 + 16);
        encode_into(text, ids, *scratch[static_cast<size_t>(worker)]);
        return ids;
      },
      [&](std::vector<TokenId>& ids) { sink(ids); });
}

void Tokenizer::encode_stream(std::istream& in, const TokenSink& sink, const EncodeOptions& options) const {
  encode_stream(read_from(in, "encode: error reading the input stream"), sink, options);
}

// ---- decoding --------------------------------------------------------------------------------------

std::string Tokenizer::decode_bytes(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) {
    LOOM_CHECK(id < vocab_.size(), "decode: token id ", id, " is out of range (vocabulary has ", vocab_.size(),
               " tokens)");
    out += vocab_[id];
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const { return replace_invalid_utf8(decode_bytes(ids)); }

std::string replace_invalid_utf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    size_t ok = valid_utf8_prefix(bytes.substr(i));
    out.append(bytes.data() + i, ok);
    i += ok;
    if (i >= n) break;
    // The maximal subpart: the longest prefix of a well-formed sequence (at least one byte).
    const unsigned char c = s[i];
    size_t len = 1;
    auto in = [&](size_t k, unsigned char lo, unsigned char hi) { return i + k < n && s[i + k] >= lo && s[i + k] <= hi; };
    if (c >= 0xC2 && c <= 0xDF) {
      len = 1;  // a valid 2-byte lead whose continuation is missing
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      if (in(1, lo, hi)) len = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      if (in(1, lo, hi)) len = in(2, 0x80, 0xBF) ? 3 : 2;
    }
    out += "\xEF\xBF\xBD";
    i += len;
  }
  return out;
}

}  // namespace loom::tokenizer
