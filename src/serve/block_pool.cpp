#include "serve/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace loom::serve {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size)
    : block_size_(block_size),
      refs_(static_cast<size_t>(num_blocks), 0),
      evictable_at_(static_cast<size_t>(num_blocks)),
      is_evictable_(static_cast<size_t>(num_blocks), false),
      entries_(static_cast<size_t>(num_blocks)) {
  LOOM_CHECK(num_blocks > 0 && num_blocks <= (int64_t{1} << 30) && block_size > 0,
             "BlockPool: needs 1 to 2^30 blocks of a positive size, got ", num_blocks, " blocks of ", block_size);
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // block 0 first
}

namespace {

// Removes the one (key, block) pair from an index.
void unindex(std::unordered_multimap<uint64_t, int32_t>& index, uint64_t key, int32_t block) {
  auto [first, last] = index.equal_range(key);
  for (auto it = first; it != last; ++it) {
    if (it->second == block) {
      index.erase(it);
      return;
    }
  }
}

}  // namespace

void BlockPool::forget(int32_t block) {
  Entry& e = entries_[static_cast<size_t>(block)];
  if (e.cached) unindex(by_hash_, e.hash, block);
  if (e.recorded) unindex(by_previous_, e.previous, block);
  e = Entry{};
}

std::optional<int32_t> BlockPool::allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    block = evictable_.front();
    evictable_.pop_front();
    is_evictable_[static_cast<size_t>(block)] = false;
    forget(block);
  } else {
    return std::nullopt;
  }
  refs_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockPool::retain(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  LOOM_ASSERT(block >= 0 && b < refs_.size());
  if (is_evictable_[b]) {
    evictable_.erase(evictable_at_[b]);
    is_evictable_[b] = false;
  }
  LOOM_ASSERT(refs_[b] > 0 || entries_[b].known());
  ++refs_[b];
}

void BlockPool::release(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  LOOM_ASSERT(block >= 0 && b < refs_.size() && refs_[b] > 0);
  if (--refs_[b] > 0) return;
  if (entries_[b].known()) {
    evictable_at_[b] = evictable_.insert(evictable_.end(), block);
    is_evictable_[b] = true;
  } else {
    free_.push_back(block);
  }
}

uint64_t BlockPool::chain_hash(uint64_t previous, std::span<const int32_t> tokens) {
  // FNV-1a over the previous hash's and the tokens' bytes, then a final avalanche (splitmix64's).
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(previous);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::optional<int32_t> BlockPool::lookup(uint64_t previous, std::span<const int32_t> tokens) const {
  const uint64_t h = chain_hash(previous, tokens);
  auto [first, last] = by_hash_.equal_range(h);
  for (auto it = first; it != last; ++it) {
    const Entry& e = entries_[static_cast<size_t>(it->second)];
    if (e.previous == previous && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
      return it->second;
    }
  }
  return std::nullopt;
}

void BlockPool::publish(int32_t block, uint64_t previous, std::span<const int32_t> tokens) {
  const size_t b = static_cast<size_t>(block);
  LOOM_ASSERT(block >= 0 && b < refs_.size() && refs_[b] > 0);
  LOOM_ASSERT(static_cast<int64_t>(tokens.size()) == block_size_);
  record(block, previous, tokens);
  if (entries_[b].cached || lookup(previous, tokens)) return;
  Entry& e = entries_[b];
  e.hash = chain_hash(previous, tokens);
  e.cached = true;
  by_hash_.emplace(e.hash, block);
}

void BlockPool::record(int32_t block, uint64_t previous, std::span<const int32_t> tokens) {
  const size_t b = static_cast<size_t>(block);
  LOOM_ASSERT(block >= 0 && b < refs_.size() && refs_[b] > 0);
  LOOM_ASSERT(static_cast<int64_t>(tokens.size()) <= block_size_);
  Entry& e = entries_[b];
  if (!e.recorded) {
    e.previous = previous;
    e.recorded = true;
    by_previous_.emplace(previous, block);
  }
  // A block's entry is cleared when it is handed out (forget), and its holder writes it in order under
  // one prefix: a record only ever grows.
  LOOM_ASSERT(e.previous == previous && tokens.size() >= e.tokens.size() &&
              std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()));
  e.tokens.insert(e.tokens.end(), tokens.begin() + static_cast<std::ptrdiff_t>(e.tokens.size()), tokens.end());
}

std::pair<int32_t, int64_t> BlockPool::longest_start(uint64_t previous, std::span<const int32_t> tokens) const {
  std::pair<int32_t, int64_t> best{-1, 0};
  auto [first, last] = by_previous_.equal_range(previous);
  for (auto it = first; it != last; ++it) {
    const Entry& e = entries_[static_cast<size_t>(it->second)];
    const size_t n = std::min(e.tokens.size(), tokens.size());
    const int64_t same = std::mismatch(e.tokens.begin(), e.tokens.begin() + static_cast<std::ptrdiff_t>(n), tokens.begin()).first -
                         e.tokens.begin();
    // The longest; among equals the lowest block, so that the choice does not depend on the index's order.
    if (same > best.second || (same == best.second && same > 0 && it->second < best.first)) best = {it->second, same};
  }
  return best;
}

}  // namespace loom::serve
