#include "core/rng.h"

#include <cmath>

#include "core/parallel.h"

namespace loom {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// FNV-1a, to turn a name into 64 bits for fold_in.
uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline float bits_to_unit(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

}  // namespace

std::array<uint32_t, 4> philox4x32(RngKey key, std::array<uint32_t, 4> ctr) {
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, ctr[0], hi0, lo0);
    mulhilo(kPhiloxM1, ctr[2], hi1, lo1);
    ctr = {hi1 ^ ctr[1] ^ k0, lo1, hi0 ^ ctr[3] ^ k1, lo0};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return ctr;
}

RngKey RngKey::fold_in(uint64_t data) const {
  // Counter words 2..3 = 0xFFFFFFFF marks key derivation, disjoint from draws (whose high words are
  // the 64-bit index's upper half and 0).
  auto r = philox4x32(*this, {static_cast<uint32_t>(data), static_cast<uint32_t>(data >> 32),
                              0xFFFFFFFFu, 0xFFFFFFFFu});
  return RngKey{r[0], r[1]};
}

RngKey RngKey::fold_in(std::string_view name) const { return fold_in(hash_name(name)); }

uint32_t random_bits(RngKey key, uint64_t index) {
  // One Philox block gives four words; element index uses word (index % 4) of block index / 4.
  uint64_t block = index >> 2;
  auto r = philox4x32(key, {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u});
  return r[index & 3];
}

float random_uniform(RngKey key, uint64_t index) { return bits_to_unit(random_bits(key, index)); }

void fill_uniform(float* out, int64_t n, RngKey key, uint64_t offset, float low, float high) {
  parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      out[i] = low + (high - low) * random_uniform(key, offset + static_cast<uint64_t>(i));
    }
  });
}

namespace {
// Standard normal for stream element `index` (attempt `attempt`), by Box-Muller on two uniforms drawn
// from a key folded with the attempt number.
float standard_normal(RngKey key, uint64_t index, uint32_t attempt) {
  RngKey k = attempt == 0 ? key : key.fold_in(static_cast<uint64_t>(attempt));
  auto r = philox4x32(k, {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 1u, 0u});
  // u1 in (0, 1] so log(u1) is finite.
  float u1 = (static_cast<float>(r[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = bits_to_unit(r[1]);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}
}  // namespace

void fill_normal(float* out, int64_t n, RngKey key, uint64_t offset, float mean, float std) {
  parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = mean + std * standard_normal(key, offset + static_cast<uint64_t>(i), 0);
  });
}

void fill_truncated_normal(float* out, int64_t n, RngKey key, uint64_t offset, float mean, float std,
                           float low, float high) {
  parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = 0.0f;
      for (uint32_t attempt = 0;; ++attempt) {
        v = mean + std * standard_normal(key, offset + static_cast<uint64_t>(i), attempt);
        if (v >= low && v <= high) break;
        if (attempt > 1000) {  // practically unreachable for a sane range; clamp rather than loop
          v = std::min(std::max(v, low), high);
          break;
        }
      }
      out[i] = v;
    }
  });
}

}  // namespace loom
