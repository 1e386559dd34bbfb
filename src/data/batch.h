// Batches of (inputs, targets) windows from a token file, for language-model training.
//
// Random sampling follows CS336's get_batch: each of the B windows starts at s uniform over
// [0, n-T-1] (n-T possible starts, so both x[0] and x[n-1] can be seen), inputs = x[s : s+T], targets =
// x[s+1 : s+T+1]. The randomness is counter-based: batch number k uses key.fold_in(k), so batch k is the
// same whatever happened before it, on any thread count, and resuming at k needs only k.
//
// Sequential sampling walks non-overlapping windows in order (window w = x[wT : wT+T+1]), B per batch,
// wrapping around at the end: one pass over the data per epoch, every token seen once.
//
// Legend: B batch size, T context length, n tokens in the file.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/token_file.h"

namespace loom::data {

enum class Sampling : uint8_t { Random, Sequential };
// Inline, so that the config reader (train/config.cpp) and its fuzz target need no tensor code.
inline const char* sampling_name(Sampling s) { return s == Sampling::Random ? "random" : "sequential"; }
inline Sampling sampling_from_name(const std::string& name) {
  if (name == "random") return Sampling::Random;
  if (name == "sequential") return Sampling::Sequential;
  LOOM_FAIL("sampling must be \"random\" or \"sequential\", got \"", name, "\"");
}

struct Batch {
  Tensor inputs;   // i32 [B, T]
  Tensor targets;  // i32 [B, T]: inputs shifted by one token
  // Rows packing several documents (fine-tuning's data.packing, train/sft_data.h): i32 [B, T] positions
  // restarting at 0 per document, and the first position of each position's document (what attention may
  // see: models::ForwardContext). Undefined for one sequence per row.
  Tensor positions, key_begin;
};

// Uniform integer in [0, range) for element `index` of the stream named by `key`: 64 random bits,
// rejected (and redrawn from key.fold_in(attempt)) when they fall in the short last copy of the range,
// so there is no modulo bias. range must be >= 1.
uint64_t uniform_below(RngKey key, uint64_t index, uint64_t range);

// The B window starts of a random batch drawn with `key`: uniform over [0, n-T-1].
std::vector<int64_t> random_starts(RngKey key, int64_t n, int64_t batch_size, int64_t context_length);

// Gathers the windows starting at `starts` into a batch (checked against the file's size).
Batch gather_batch(const TokenFile& tokens, const std::vector<int64_t>& starts, int64_t context_length);

// CS336's get_batch: B random windows drawn with `key` (already specific to this batch).
Batch get_batch(const TokenFile& tokens, int64_t batch_size, int64_t context_length, RngKey key);

// Where a loader is: enough to continue exactly after a checkpoint.
struct LoaderState {
  uint64_t batches = 0;  // batches drawn so far (random mode: the next batch's number)
  int64_t position = 0;  // sequential mode: the next window's index
  bool operator==(const LoaderState&) const = default;
};
void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);

class BatchLoader {
 public:
  // Throws loom::Error (naming the values) unless the file holds at least B*T + 1 tokens: a batch may
  // not ask for more tokens than the data has.
  BatchLoader(TokenFile tokens, int64_t batch_size, int64_t context_length, Sampling sampling, RngKey key);

  // The next batch; advances the state.
  Batch next();
  // The starts of the next batch without gathering it (advances the state like next()).
  std::vector<int64_t> next_starts();
  // `count` batches as the loader would draw from a fresh state, without touching its state: a fixed
  // evaluation set.
  std::vector<Batch> fixed_batches(int64_t count) const;

  LoaderState state() const { return state_; }
  // Continues from a saved state; throws if the position is out of range for this data.
  void restore(const LoaderState& state);

  int64_t batch_size() const { return batch_size_; }
  int64_t context_length() const { return context_length_; }
  Sampling sampling() const { return sampling_; }
  const TokenFile& tokens() const { return tokens_; }
  // Sequential mode: the number of complete non-overlapping windows, (n-1) / T.
  int64_t num_windows() const { return (tokens_.size() - 1) / context_length_; }

 private:
  std::vector<int64_t> starts_at(const LoaderState& state) const;
  void advance(LoaderState& state) const;

  TokenFile tokens_;
  int64_t batch_size_;
  int64_t context_length_;
  Sampling sampling_;
  RngKey key_;
  LoaderState state_;
};

}  // namespace loom::data
