// Rotary position embedding (Su et al., RoFormer), differentiable in x.
#pragma once

#include <utility>

#include "core/tensor.h"

namespace loom::ops {

enum class RopeStyle {
  Interleaved,  // rotates pairs (x[2i], x[2i+1]): CS336 and the original paper
  RotateHalf,   // rotates pairs (x[i], x[i + D/2]): Hugging Face Llama
};

// cos/sin(p * theta^(-2i/D)) precomputed for positions p in [0, max_len): cos, sin: [max_len, D/2].
// A RotaryPositionalEmbedding module builds one once; ops given one gather rows instead of computing.
struct RopeCache {
  Tensor cos, sin;
  float theta = 10000.0f;
  int64_t head_dim = 0;
  bool defined() const { return cos.defined(); }
  int64_t max_len() const { return cos.defined() ? cos.size(0) : 0; }
};
RopeCache make_rope_cache(int64_t max_len, int64_t head_dim, float theta);

// The per-position tables [P, D/2] for `positions` (P entries): rows gathered from `cache` when it is
// defined (a position outside [0, max_len) is an error naming it), else computed.
std::pair<Tensor, Tensor> rope_tables(const Tensor& positions, int64_t head_dim, float theta,
                                      const RopeCache& cache = RopeCache());

// x: [..., T, D] with D even; positions: i32, either [T] (shared by all leading dims) or exactly
// x's leading shape [..., T]. Pair i at position p is rotated by angle p * theta^(-2i/D).
Tensor rope(const Tensor& x, const Tensor& positions, float theta = 10000.0f,
            RopeStyle style = RopeStyle::Interleaved);
// The same rotation with angles from a precomputed cache.
Tensor rope(const Tensor& x, const Tensor& positions, const RopeCache& cache,
            RopeStyle style = RopeStyle::Interleaved);

}  // namespace loom::ops
