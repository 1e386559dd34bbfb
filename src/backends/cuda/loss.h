// CUDA kernels for the fused softmax + cross-entropy (the contracts of backends/cpu/loss.h), in pieces
// the ops chain on one stream with nothing read back to the host, so a training step stays capturable:
//
//   count_targets     count[0] = #targets != ignore_index                      (a device scalar)
//   cross_entropy_rows per row: row_loss[n] = logsumexp(x[n]) - x[n, t[n]] (double), and, when wanted,
//                      grad[n,:] = (softmax(x[n]) - onehot(t[n])) / count  (0 for ignored rows)
//   mean_loss          loss[0] = sum_n row_loss[n] / count, summed in a fixed order (0 when count is 0)
//   scale_by           x *= s[0] (the backward's upstream gradient, a device scalar)
//
// Legend: N rows (positions), V classes. Targets must be valid (ops check them with cuda::scan_ids); a
// bad one contributes nothing and has no gradient, it never reads outside the row.
#pragma once

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace loom::cuda {

void count_targets(const Context& ctx, int64_t* count, const int32_t* targets, int64_t N, int32_t ignore_index);

// grad may equal logits (the gradient overwrites the logits in place) or be null. Rows of logits and grad
// are ld apart (0: V; the fused head pads them to 16-byte rows for the GEMMs).
void cross_entropy_rows(const Context& ctx, double* row_loss, float* grad, const float* logits, const int32_t* targets,
                        int64_t N, int64_t V, int32_t ignore_index, const int64_t* count, int64_t ld = 0);

void mean_loss(const Context& ctx, float* loss, const double* row_loss, int64_t N, const int64_t* count);

void scale_by(const Context& ctx, float* x, const float* s, int64_t n);

}  // namespace loom::cuda
