// Rotary position embedding (Su et al., RoFormer), differentiable in x.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

enum class RopeStyle {
  Interleaved,  // rotates pairs (x[2i], x[2i+1]): CS336 and the original paper
  RotateHalf,   // rotates pairs (x[i], x[i + D/2]): Hugging Face Llama
};

// x: [..., T, D] with D even; positions: i32, either [T] (shared by all leading dims) or exactly
// x's leading shape [..., T]. Pair i at position p is rotated by angle p * theta^(-2i/D).
Tensor rope(const Tensor& x, const Tensor& positions, float theta = 10000.0f,
            RopeStyle style = RopeStyle::Interleaved);

}  // namespace loom::ops
