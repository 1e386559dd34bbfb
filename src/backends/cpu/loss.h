// CPU kernels for the fused softmax + cross-entropy. Legend: N rows (positions), V classes (vocab).
#pragma once

#include <cstdint>

namespace loom::cpu {

// Scans targets [N]: returns how many are not ignore_index, and sets *first_bad to the index of the
// first target outside [0, V) that is not ignore_index (-1 if none).
int64_t cross_entropy_count(const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index,
                            int64_t* first_bad);

// Sum over non-ignored rows of logsumexp(logits[n]) - logits[n, target[n]], with the max subtracted
// before exp. Rows run in parallel; per-row losses are summed in row order (deterministic).
//
// If grad is not null it also writes grad[n,:] = (softmax(logits[n]) - onehot(target[n])) * grad_scale
// for non-ignored rows and zeros for ignored rows, reusing the forward's exponentials (one exp per
// element in all). targets must be valid (see cross_entropy_count).
double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                             int32_t ignore_index, float* grad, float grad_scale);

// x[i] *= s over n elements, in parallel (rescales a saved gradient by the upstream gradient).
void scale_inplace(float* x, float s, int64_t n);

// The reference: double precision, std::exp, one row at a time. Same contract (the tests' oracle).
double cross_entropy_reference(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                               int32_t ignore_index, float* grad, float grad_scale);

}  // namespace loom::cpu
