// Sequences run through nn/paged_decoder.h's batched decoder the way a server runs them: each sequence's
// tokens fed in chunks, many sequences' chunks in one step, in an order that may change every step, their
// blocks spread through the cache. The batch-invariance tests of every family (tests/models/llama,
// tests/serve) compare the logits such runs keep.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "core/rng.h"
#include "nn/paged_decoder.h"

namespace loom::test {

// n token ids in [0, V), drawn from `seed`.
inline std::vector<int32_t> paged_tokens(uint64_t seed, int64_t n, int64_t V) {
  std::vector<int32_t> out;
  RngKey key = RngKey::from_seed(seed);
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(random_uniform(key, static_cast<uint64_t>(i)) * V) % V);
  return out;
}

// A sequence's run: its tokens fed in chunks, the logits of each chunk's last token kept, in feeding order.
struct PagedSeq {
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks;  // sizes, summing to ids.size()
  std::vector<int32_t> table;
  int64_t fed = 0;
  size_t next_chunk = 0;
  std::vector<std::vector<float>> logits;
};

// Chunks for a prompt then `decode` single tokens: the prompt cut at the given sizes.
inline std::vector<int64_t> paged_chunks(std::vector<int64_t> prompt_cuts, int64_t decode) {
  for (int64_t i = 0; i < decode; ++i) prompt_cuts.push_back(1);
  return prompt_cuts;
}

inline std::vector<size_t> in_order(int64_t, size_t n) {
  std::vector<size_t> o(n);
  std::iota(o.begin(), o.end(), 0);
  return o;
}

// Runs every sequence to its end: at each step the sequences with chunks left, in the order `order`
// gives (a function of the step), each contribute their next chunk. Blocks are handed out with a stride,
// so each scenario puts the sequences in other blocks of the cache (nn::PagedKVCache for w's shape).
inline void run_paged(const nn::DecoderWeights& w, std::vector<PagedSeq>& seqs, int64_t block_size, int64_t stride,
                      const std::function<std::vector<size_t>(int64_t, size_t)>& order) {
  const int64_t blocks_per_seq = (w.context_length + block_size - 1) / block_size;
  nn::PagedKVCache cache(w, blocks_per_seq * static_cast<int64_t>(seqs.size()) * stride, block_size);
  int32_t next = 0;
  for (PagedSeq& s : seqs) {
    s.table.clear();
    for (int64_t b = 0; b < blocks_per_seq; ++b) {
      s.table.push_back(next);
      next += static_cast<int32_t>(stride);
      if (next >= cache.num_blocks()) next = next % static_cast<int32_t>(stride) + 1;
    }
  }
  for (int64_t step = 0;; ++step) {
    std::vector<nn::DecoderBatchItem> items;
    std::vector<PagedSeq*> wanting;
    for (size_t i : order(step, seqs.size())) {
      PagedSeq& s = seqs[i];
      if (s.next_chunk == s.chunks.size()) continue;
      const int64_t n = s.chunks[s.next_chunk++];
      items.push_back({&s.table, s.fed, std::span<const int32_t>(s.ids.data() + s.fed, static_cast<size_t>(n)), true});
      s.fed += n;
      wanting.push_back(&s);
    }
    if (items.empty()) break;
    Tensor out = nn::paged_decoder_forward(w, cache, items);
    ASSERT_EQ(out.size(0), static_cast<int64_t>(wanting.size()));
    const int64_t V = out.size(1);
    for (size_t i = 0; i < wanting.size(); ++i) {
      wanting[i]->logits.emplace_back(out.data<float>() + static_cast<int64_t>(i) * V,
                                      out.data<float>() + static_cast<int64_t>(i + 1) * V);
    }
  }
}

}  // namespace loom::test
