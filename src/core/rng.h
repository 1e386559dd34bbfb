// Counter-based randomness (Philox4x32-10, Salmon et al., SC'11), with JAX-style explicit keys.
//
// A Key is two 32-bit words. Nothing is global: every random draw names its key, and keys are split
// deterministically: `key.fold_in("layers.3.attn.q_proj.weight")` or `key.fold_in(step)`. Element i of a
// draw uses counter (offset + i), so:
//   * results do not depend on thread count (each element's value depends only on key and index);
//   * a shard of a tensor is drawn by passing its global offset: every rank gets its slice of the same
//     global tensor.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace loom {

class Tensor;

struct RngKey {
  uint32_t k0 = 0, k1 = 0;

  static RngKey from_seed(uint64_t seed) {
    return RngKey{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  }
  // A new, independent key derived from this one and a number (a step, a layer index, a stream id).
  RngKey fold_in(uint64_t data) const;
  // A new key derived from a name (a parameter's dotted name, "dropout", "data").
  RngKey fold_in(std::string_view name) const;
  bool operator==(const RngKey&) const = default;
};

// The Philox4x32-10 block function: four 32-bit outputs for a 128-bit counter.
std::array<uint32_t, 4> philox4x32(RngKey key, std::array<uint32_t, 4> counter);

// Random 32 bits for element `index` of the stream named by `key`.
uint32_t random_bits(RngKey key, uint64_t index);
// Uniform in [0, 1) with 24 bits of precision for element `index`.
float random_uniform(RngKey key, uint64_t index);

// Fill a float buffer; element i uses stream index (offset + i).
void fill_uniform(float* out, int64_t n, RngKey key, uint64_t offset, float low, float high);
void fill_normal(float* out, int64_t n, RngKey key, uint64_t offset, float mean, float std);
// Normal(mean, std) truncated to [low, high] by rejection, resampling with fresh counters, so element i
// still depends only on (key, offset + i).
void fill_truncated_normal(float* out, int64_t n, RngKey key, uint64_t offset, float mean, float std,
                           float low, float high);

}  // namespace loom
