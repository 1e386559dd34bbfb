#include "data/batch.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json.h"

namespace loom::data {

uint64_t uniform_below(RngKey key, uint64_t index, uint64_t range) {
  LOOM_ASSERT(range >= 1, "uniform_below needs a non-empty range");
  // Accept x < limit, the largest multiple of range that fits in 2^64; then x % range is uniform.
  // (2^64 - range) % range == 2^64 % range, computed without overflow.
  uint64_t rejected = (0 - range) % range;
  uint64_t limit = 0 - rejected;  // 2^64 - (2^64 % range), wrapping to 0 when rejected == 0
  for (uint32_t attempt = 0;; ++attempt) {
    RngKey k = attempt == 0 ? key : key.fold_in(static_cast<uint64_t>(attempt));
    uint64_t x = (static_cast<uint64_t>(random_bits(k, 2 * index)) << 32) | random_bits(k, 2 * index + 1);
    if (rejected == 0 || x < limit) return x % range;
  }
}

static void check_fits(int64_t n, int64_t batch_size, int64_t context_length, const std::string& path) {
  LOOM_CHECK(batch_size > 0, "data: batch_size must be positive, got ", batch_size);
  LOOM_CHECK(context_length > 0, "data: context_length must be positive, got ", context_length);
  LOOM_CHECK(n >= batch_size * context_length + 1, "data: a batch of batch_size=", batch_size,
             " x context_length=", context_length, " needs at least ", batch_size * context_length + 1,
             " tokens but ", path, " holds ", n);
}

std::vector<int64_t> random_starts(RngKey key, int64_t n, int64_t batch_size, int64_t context_length) {
  LOOM_CHECK(n >= context_length + 1, "get_batch: context_length=", context_length, " needs at least ",
             context_length + 1, " tokens, got ", n);
  std::vector<int64_t> starts(static_cast<size_t>(batch_size));
  auto range = static_cast<uint64_t>(n - context_length);  // starts 0 .. n-T-1
  for (int64_t b = 0; b < batch_size; ++b) {
    starts[static_cast<size_t>(b)] = static_cast<int64_t>(uniform_below(key, static_cast<uint64_t>(b), range));
  }
  return starts;
}

Batch gather_batch(const TokenFile& tokens, const std::vector<int64_t>& starts, int64_t context_length) {
  const auto B = static_cast<int64_t>(starts.size());
  const int64_t T = context_length;
  Batch batch;
  batch.inputs = Tensor::empty({B, T}, DType::I32);
  batch.targets = Tensor::empty({B, T}, DType::I32);
  int32_t* x = batch.inputs.data<int32_t>();   // [B, T]
  int32_t* y = batch.targets.data<int32_t>();  // [B, T]
  for (int64_t b = 0; b < B; ++b) {
    int64_t s = starts[static_cast<size_t>(b)];
    LOOM_CHECK(s >= 0 && s + T + 1 <= tokens.size(), "get_batch: window start ", s, " with context_length=", T,
               " runs past the ", tokens.size(), " tokens of ", tokens.path());
    tokens.copy_to(s, T, x + b * T);
    tokens.copy_to(s + 1, T, y + b * T);
  }
  return batch;
}

Batch get_batch(const TokenFile& tokens, int64_t batch_size, int64_t context_length, RngKey key) {
  return gather_batch(tokens, random_starts(key, tokens.size(), batch_size, context_length), context_length);
}

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"batches", s.batches}, {"position", s.position}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  LOOM_CHECK(j.is_object() && j.contains("batches") && j["batches"].is_number_unsigned() &&
                 j.contains("position") && j["position"].is_number_integer(),
             "loader state must be {\"batches\": uint, \"position\": int}, got ", io::brief_json(j));
  s.batches = j["batches"].get<uint64_t>();
  s.position = j["position"].get<int64_t>();
}

BatchLoader::BatchLoader(TokenFile tokens, int64_t batch_size, int64_t context_length, Sampling sampling,
                         RngKey key)
    : tokens_(std::move(tokens)),
      batch_size_(batch_size),
      context_length_(context_length),
      sampling_(sampling),
      key_(key) {
  check_fits(tokens_.size(), batch_size, context_length, tokens_.path());
}

std::vector<int64_t> BatchLoader::starts_at(const LoaderState& state) const {
  if (sampling_ == Sampling::Random) {
    return random_starts(key_.fold_in(state.batches), tokens_.size(), batch_size_, context_length_);
  }
  std::vector<int64_t> starts(static_cast<size_t>(batch_size_));
  const int64_t windows = num_windows();
  for (int64_t b = 0; b < batch_size_; ++b) {
    starts[static_cast<size_t>(b)] = ((state.position + b) % windows) * context_length_;
  }
  return starts;
}

void BatchLoader::advance(LoaderState& state) const {
  state.batches += 1;
  if (sampling_ == Sampling::Sequential) state.position = (state.position + batch_size_) % num_windows();
}

std::vector<int64_t> BatchLoader::next_starts() {
  std::vector<int64_t> starts = starts_at(state_);
  advance(state_);
  return starts;
}

Batch BatchLoader::next() { return gather_batch(tokens_, next_starts(), context_length_); }

std::vector<Batch> BatchLoader::fixed_batches(int64_t count) const {
  std::vector<Batch> out;
  LoaderState s;
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(gather_batch(tokens_, starts_at(s), context_length_));
    advance(s);
  }
  return out;
}

void BatchLoader::restore(const LoaderState& state) {
  LOOM_CHECK(state.position >= 0 && state.position < num_windows(), "loader state: position ", state.position,
             " is outside the ", num_windows(), " windows of ", tokens_.path(), " at context_length=",
             context_length_);
  state_ = state;
}

}  // namespace loom::data
