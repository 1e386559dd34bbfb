#include "tokenizer/train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>
#include <set>
#include <thread>


#include "io/json.h"
#include "core/error.h"
#include "core/thread_count.h"
#include "tokenizer/chunk_pipeline.h"

namespace loom::tokenizer {
namespace {

using Clock = std::chrono::steady_clock;

// How a progress update starts and ends: on a terminal one line rewritten in place ("\r", ""); into a
// file or pipe one line per update ("", "\n").
std::pair<const char*, const char*> progress_line_ends() {
  return ::isatty(::fileno(stderr)) != 0 ? std::pair<const char*, const char*>{"\r", ""}
                                         : std::pair<const char*, const char*>{"", "\n"};
}

void validate(const TrainOptions& options) {
  std::set<std::string> seen;
  for (const std::string& s : options.special_tokens) {
    LOOM_CHECK(!s.empty(), "train: a special token (--special-token) is empty");
    LOOM_CHECK(s.size() > 1, "train: special token \"", s, "\" is a single byte, which the byte vocabulary already has");
    LOOM_CHECK(valid_utf8_prefix(s) == s.size(), "train: special token (--special-token) \"", io::brief_text(s), "\" is not valid UTF-8");
    LOOM_CHECK(seen.insert(s).second, "train: special token \"", s, "\" is given twice");
  }
  const size_t minimum = 256 + options.special_tokens.size();
  LOOM_CHECK(options.vocab_size >= minimum, "train: vocab size (--vocab-size, vocab_size) ", options.vocab_size,
             " is smaller than 256 bytes + ", options.special_tokens.size(),
             " special tokens (--special-token, special_tokens) = ", minimum);
}

int resolve_threads(int threads) { return resolve_thread_count(threads, "train: threads"); }

}  // namespace

PreTokenCounts count_pretokens(const ReadFn& read, const std::vector<std::string>& special_tokens, int threads,
                               size_t chunk_bytes, bool progress) {
  threads = resolve_threads(threads);
  const SpecialTokenMatcher specials(special_tokens);
  const PreTokenizer pre;
  TextChunker chunker(read, specials, pre, chunk_bytes);
  std::vector<PreTokenCounts> partial(static_cast<size_t>(threads));
  std::vector<std::unique_ptr<PreTokenizer::MatchData>> match(static_cast<size_t>(threads));
  for (auto& m : match) m = std::make_unique<PreTokenizer::MatchData>(pre);
  auto count_chunk = [&](const std::string& text, size_t t) {
    PreTokenCounts& counts = partial[t];
    size_t from = 0;
    while (true) {
      auto special = specials.find(text, from);
      const size_t end = special ? special->begin : text.size();
      pre.for_each(std::string_view(text).substr(from, end - from), *match[t],
                   [&](std::string_view piece) { ++counts[std::string(piece)]; });
      if (!special) break;
      from = special->begin + special->length;
    }
  };
  auto last_report = Clock::now();
  const auto [cr, nl] = progress_line_ends();
  run_chunk_pipeline<int>(
      chunker, threads,
      [&](const std::string& text, int worker) {
        count_chunk(text, static_cast<size_t>(worker));
        return 0;
      },
      [&](int) {
        if (progress && Clock::now() - last_report > std::chrono::seconds(1)) {
          std::fprintf(stderr, "%strain: pre-tokenized %.1f MB%s", cr, static_cast<double>(chunker.bytes_read()) / 1e6, nl);
          last_report = Clock::now();
        }
      });
  if (progress) std::fprintf(stderr, "%strain: pre-tokenized %.1f MB\n", cr, static_cast<double>(chunker.bytes_read()) / 1e6);
  // Sums do not depend on which thread counted what.
  PreTokenCounts total = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t) {
    for (auto& [piece, n] : partial[t]) total[piece] += n;
  }
  return total;
}

Tokenizer train_bpe_from_counts(const PreTokenCounts& counts, const TrainOptions& options) {
  validate(options);
  const auto start = Clock::now();
  const size_t num_special = options.special_tokens.size();
  std::vector<std::string> vocab(options.special_tokens);
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  std::vector<std::pair<TokenId, TokenId>> merges;

  // Words: each distinct pre-token once, as its current symbols, with its count. Sorted by bytes so
  // that the internal order never depends on hash-map iteration order.
  struct Word {
    std::vector<TokenId> symbols;
    uint64_t count;
  };
  std::vector<std::pair<std::string_view, uint64_t>> sorted;
  sorted.reserve(counts.size());
  uint64_t total_bytes = 0;
  for (auto& [piece, n] : counts) {
    sorted.emplace_back(piece, n);
    total_bytes += piece.size() * n;
  }
  LOOM_CHECK(total_bytes > 0, "train: the input is empty (no text outside special tokens)");
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (auto& [piece, n] : sorted) {
    Word w{{}, n};
    w.symbols.reserve(piece.size());
    for (unsigned char c : piece) w.symbols.push_back(static_cast<TokenId>(num_special + c));
    words.push_back(std::move(w));
  }

  // Pair statistics: count over all occurrences, and the words that (may) contain the pair. The word
  // lists are only ever appended to; a listed word that no longer holds the pair is skipped.
  auto key = [](TokenId a, TokenId b) { return (uint64_t{a} << 32) | b; };
  struct PairStats {
    int64_t count = 0;
    std::vector<uint32_t> words;
  };
  std::unordered_map<uint64_t, PairStats> pairs;
  pairs.reserve(1 << 16);
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      PairStats& ps = pairs[key(s[i], s[i + 1])];
      ps.count += static_cast<int64_t>(words[w].count);
      if (ps.words.empty() || ps.words.back() != w) ps.words.push_back(w);
    }
  }

  // Max-heap on (count, left bytes, right bytes). An entry is stale when its count is no longer the
  // pair's count; every change pushes a fresh entry, so the true maximum is always in the heap.
  struct Entry {
    int64_t count;
    TokenId a, b;
  };
  auto less = [&vocab](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    int c = vocab[x.a].compare(vocab[y.a]);  // std::string compares bytes as unsigned, like Python
    if (c != 0) return c < 0;
    return vocab[x.b] < vocab[y.b];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(less)> heap(less);
  for (auto& [k, ps] : pairs) heap.push({ps.count, static_cast<TokenId>(k >> 32), static_cast<TokenId>(k & 0xFFFFFFFFu)});

  std::vector<uint32_t> seen_at(words.size(), UINT32_MAX);  // the step that last rewrote a word
  std::unordered_map<uint64_t, int64_t> delta;
  std::vector<TokenId> merged;
  auto last_report = Clock::now();
  const size_t target_merges = options.vocab_size - vocab.size();
  while (merges.size() < target_merges && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto it = pairs.find(key(top.a, top.b));
    if (it == pairs.end() || it->second.count != top.count) continue;  // stale
    if (top.count <= 0) break;
    const auto step = static_cast<uint32_t>(merges.size());
    const TokenId a = top.a, b = top.b;
    const auto c = static_cast<TokenId>(vocab.size());
    vocab.push_back(vocab[a] + vocab[b]);
    merges.emplace_back(a, b);

    std::vector<uint32_t> affected = std::move(it->second.words);
    pairs.erase(it);
    delta.clear();
    for (uint32_t w : affected) {
      if (seen_at[w] == step) continue;
      seen_at[w] = step;
      auto& s = words[w].symbols;
      const auto n = static_cast<int64_t>(words[w].count);
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      // Replace occurrences left to right; adjust the counts of the pairs around each one.
      merged.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(c);
          i += 2;
        } else {
          merged.push_back(s[i]);
          i += 1;
        }
      }
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = key(s[i], s[i + 1]);
        if (k != key(a, b)) delta[k] -= n;
      }
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        const uint64_t k = key(merged[i], merged[i + 1]);
        delta[k] += n;
        if (merged[i] == c || merged[i + 1] == c) {
          auto& list = pairs[k].words;
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
      s.swap(merged);
    }
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      PairStats& ps = pairs[k];
      ps.count += d;
      LOOM_ASSERT(ps.count >= 0, "negative pair count in BPE training");
      if (ps.count > 0) heap.push({ps.count, static_cast<TokenId>(k >> 32), static_cast<TokenId>(k & 0xFFFFFFFFu)});
    }
    if (options.progress && Clock::now() - last_report > std::chrono::seconds(1)) {
      std::fprintf(stderr, "%strain: %zu / %zu merges%s", progress_line_ends().first, merges.size(), target_merges,
                   progress_line_ends().second);
      last_report = Clock::now();
    }
  }
  if (options.progress) {
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "%strain: %zu / %zu merges in %.2f s%s\n", progress_line_ends().first, merges.size(), target_merges, secs,
                 merges.size() < target_merges ? " (no pairs left: the vocabulary is smaller than asked)" : "");
  }
  return Tokenizer(std::move(vocab), std::move(merges), options.special_tokens);
}

Tokenizer train_bpe(const std::vector<std::string>& files, const TrainOptions& options) {
  validate(options);
  LOOM_CHECK(!files.empty(), "train: no input files");
  PreTokenCounts counts;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(str("train: cannot open ", path, ": ", std::strerror(errno)));
    const ReadFn read = read_from(in, str("train: error reading ", path));
    PreTokenCounts c = count_pretokens(read, options.special_tokens, options.threads, options.chunk_bytes, options.progress);
    if (counts.empty()) {
      counts = std::move(c);
    } else {
      for (auto& [piece, n] : c) counts[piece] += n;
    }
  }
  return train_bpe_from_counts(counts, options);
}

Tokenizer train_bpe_on_text(std::string_view text, const TrainOptions& options) {
  validate(options);
  return train_bpe_from_counts(
      count_pretokens(read_from(text), options.special_tokens, options.threads, options.chunk_bytes, options.progress), options);
}

}  // namespace loom::tokenizer
