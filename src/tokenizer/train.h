// Byte-level BPE training with the CS336 assignment's semantics:
//   - special tokens are cut out of the text first and never take part in a merge;
//   - the rest is cut by GPT-2's regex; merges never cross a pre-token boundary;
//   - the initial vocabulary is the special tokens (ids 0..S-1, in the order given) then the 256 bytes
//     (ids S..S+255, in byte order);
//   - each step merges the most frequent adjacent pair, counted over all pre-token occurrences; ties go
//     to the lexicographically greatest pair (left token's bytes, then right token's bytes);
//   - inside a pre-token a merge replaces occurrences left to right without overlap ("a a a" -> "aa a").
// Training stops at vocab_size tokens, or earlier when no pair is left.
//
// How it stays fast: pre-tokens are counted once (in parallel, over chunks cut at pre-token
// boundaries; the counts are the same for any thread count, so the merges are too), each distinct
// pre-token is one word with a count, pair counts are updated only for the words a merge touches (an
// index from pair to words finds them), and the best pair comes off a max-heap whose stale entries are
// skipped when popped.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace loom::tokenizer {

struct TrainOptions {
  size_t vocab_size = 0;
  std::vector<std::string> special_tokens;
  int threads = 0;                       // pre-tokenization threads; 0 takes every core
  size_t chunk_bytes = size_t{1} << 20;  // text per pre-tokenization task
  bool progress = false;                 // report progress on stderr
};

// Distinct pre-token -> number of occurrences, special tokens removed.
using PreTokenCounts = std::unordered_map<std::string, uint64_t>;

PreTokenCounts count_pretokens(const ReadFn& read, const std::vector<std::string>& special_tokens, int threads,
                               size_t chunk_bytes, bool progress = false);

// The merges from pre-token counts.
Tokenizer train_bpe_from_counts(const PreTokenCounts& counts, const TrainOptions& options);
// Trains on the files' contents (read as a stream, one after the other; each file is cut separately).
Tokenizer train_bpe(const std::vector<std::string>& files, const TrainOptions& options);
Tokenizer train_bpe_on_text(std::string_view text, const TrainOptions& options);

}  // namespace loom::tokenizer
