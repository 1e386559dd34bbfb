#include "backends/cpu/row_linear.h"

#include <algorithm>

#include "backends/cpu/fixed_dot.h"
#include "core/parallel.h"

namespace loom::cpu {

namespace {

namespace fd = fixed_dot;

// y[m0 + r, n0 + c] for r < MR, c < NR: MR * NR accumulators over one pass of K.
template <int MR, int NR>
void block(const float* x, int64_t K, const float* w, int64_t m0, int64_t n0, float* y, int64_t N) {
  const int64_t k8 = K - K % 8;
  fd::Acc acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) acc[r][c] = fd::zero();
  }
  const float* xr[MR];
  const float* wc[NR];
  for (int r = 0; r < MR; ++r) xr[r] = x + (m0 + r) * K;
  for (int c = 0; c < NR; ++c) wc[c] = w + (n0 + c) * K;
  for (int64_t k = 0; k < k8; k += 8) {
    fd::Acc wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = fd::load(wc[c] + k);
    for (int r = 0; r < MR; ++r) {
      const fd::Acc xv = fd::load(xr[r] + k);
      for (int c = 0; c < NR; ++c) acc[r][c] = fd::fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) y[(m0 + r) * N + n0 + c] = fd::tail(fd::finish(acc[r][c]), xr[r], wc[c], k8, K);
  }
}

template <int MR>
void columns(const float* x, int64_t K, const float* w, int64_t m0, int64_t n0, int64_t n1, float* y, int64_t N) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) block<MR, 2>(x, K, w, m0, n, y, N);
  for (; n < n1; ++n) block<MR, 1>(x, K, w, m0, n, y, N);
}

}  // namespace

void row_linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  if (M == 0 || N == 0) return;
  // Columns in chunks of 32 (a [32, K] slice of W stays in L2 while every row of x passes it); the
  // chunks depend on N only.
  parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) columns<4>(x, K, w, m, n0, n1, y, N);
    for (; m < M; ++m) columns<1>(x, K, w, m, n0, n1, y, N);
  });
}

void row_linear_reference(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(x[m * K + k]) * w[n * K + k];
      y[m * N + n] = static_cast<float>(s);
    }
  }
}

}  // namespace loom::cpu
