// The KV cache's blocks, handed out per sequence (paged, as vLLM's): a fixed number of blocks of
// block_size positions, set at start-up from a memory budget, each block referenced by the sequences
// that use it and returned to the pool when the last of them ends.
//
// Prefix cache: a full block is known by the hash of its tokens chained to its predecessor's hash, so a
// block holding positions [i*S, (i+1)*S) of a prompt can serve every later prompt that starts with the
// same (i+1)*S tokens: the system prompt's blocks are computed once. A block whose sequences have all
// ended keeps its contents and stays findable until the pool needs it for something else (least recently
// released first). This is sound because the decoder computes a position's keys and values from its
// sequence's tokens alone (nn/paged_decoder.h), so a cached block is bitwise what a recomputation would
// write. Lookups compare the block's tokens and its predecessor's hash as well as its own hash.
//
// To the token: a block's leading positions serve a later prompt too when it is not full (the end of a
// prompt or reply) or only starts the same way. Every block records the tokens whose keys and values it
// holds (record()), and a new sequence finds the block after its cached full ones whose recorded tokens
// start like its own (longest_start()); those positions are copied into a block of its own, since it
// writes its own tokens after them (llama.cpp's server reuses a slot's cache to the token in the same
// way). A released block that recorded tokens stays findable like a cached full one.
//
// Not thread-safe: the engine's scheduler thread owns it; the metrics read a snapshot it publishes.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <utility>
#include <span>
#include <unordered_map>
#include <vector>

namespace loom::serve {

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks that allocate() can hand out: never used, released, or cached without a user.
  int64_t available() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  // Blocks referenced by at least one sequence.
  int64_t in_use() const { return num_blocks() - available(); }
  // Unreferenced blocks that still hold a cached prefix (part of available()).
  int64_t cached() const { return static_cast<int64_t>(evictable_.size()); }

  // A block with one reference: a free one, else the least recently released cached one (forgotten).
  // nullopt when every block is in use.
  std::optional<int32_t> allocate();
  // Whether `block` holds a cached prefix that no sequence uses (retaining it takes it out of available()).
  bool unused(int32_t block) const { return refs_[static_cast<size_t>(block)] == 0; }
  // One more reference to `block` (a prefix-cache hit), taking it off the evictable list.
  void retain(int32_t block);
  // One reference less; at none the block is free again, or cached when it holds a known prefix.
  void release(int32_t block);

  // The hash a full block's tokens get, chained to the previous block's (0 for the first block).
  static uint64_t chain_hash(uint64_t previous, std::span<const int32_t> tokens);
  // The cached block holding `tokens` after the prefix whose last block hashed to `previous`.
  std::optional<int32_t> lookup(uint64_t previous, std::span<const int32_t> tokens) const;
  // Records that `block` (in use, full) holds `tokens` after `previous`. A second block with the same
  // contents is not recorded (the first stays the one found).
  void publish(int32_t block, uint64_t previous, std::span<const int32_t> tokens);

  // Records that `block` (in use) holds the keys and values of `tokens` at its first tokens.size()
  // positions, after the prefix whose last full block hashed to `previous`; a later call for the same
  // block passes what it held and more (a sequence's positions are written once, in order).
  void record(int32_t block, uint64_t previous, std::span<const int32_t> tokens);
  // The block whose recorded tokens after `previous` start with the most of `tokens`, and how many:
  // {-1, 0} when none starts with tokens[0].
  std::pair<int32_t, int64_t> longest_start(uint64_t previous, std::span<const int32_t> tokens) const;

  // Counters since start-up, for the metrics.
  int64_t hits() const { return hits_; }
  int64_t lookups() const { return lookups_; }
  void count_lookup(bool hit) const {
    ++lookups_;
    hits_ += hit ? 1 : 0;
  }

 private:
  // What a block holds: `tokens` after the prefix `previous`. cached: full and published (in by_hash_);
  // recorded: in by_previous_ (full or not).
  struct Entry {
    uint64_t previous = 0;
    std::vector<int32_t> tokens;
    uint64_t hash = 0;
    bool cached = false;
    bool recorded = false;
    bool known() const { return cached || recorded; }
  };
  void forget(int32_t block);

  int64_t block_size_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack of never-cached blocks
  std::list<int32_t> evictable_;  // cached blocks without users, least recently released first
  std::vector<std::list<int32_t>::iterator> evictable_at_;
  std::vector<bool> is_evictable_;
  std::vector<Entry> entries_;
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  std::unordered_multimap<uint64_t, int32_t> by_previous_;  // recorded blocks by their prefix's hash
  mutable int64_t hits_ = 0, lookups_ = 0;
};

}  // namespace loom::serve
