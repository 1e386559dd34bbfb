// y = x W^T computed so that each row of y depends on its own row of x only: the kernel of
// ops::row_linear, which serving uses to make a request's results independent of the batch it runs in.
//
// Legend: M rows of x and y (tokens, from any number of sequences), K in features, N out features.
//   x: [M, K] f32, W: [N, K] f32 (PyTorch's Linear layout), y: [M, N] f32, all contiguous.
//
// A GEMM library picks its kernel, and with it the order in which it sums over K, by the problem's shape:
// the same row of x can come out of oneDNN with other low bits at M = 1 than at M = 7. Here every output
// is fixed_dot::dot(x[m], W[n]) (backends/cpu/fixed_dot.h), whatever M is: rows are grouped four at a
// time and columns two at a time so that each weight row is read once per group of rows, but a group
// only shares the loads, never the sums. The thread split is over N, so the thread count changes nothing
// either. row_linear_reference is the same product summed in double: the oracle.
#pragma once

#include <cstdint>

namespace loom::cpu {

void row_linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y);
void row_linear_reference(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y);

}  // namespace loom::cpu
