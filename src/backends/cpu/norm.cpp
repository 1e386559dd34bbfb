// CPU kernels for RMSNorm and LayerNorm. Legend and conventions: see norm.h.
//
// Speed: these are memory-bound (a few flops per element), so each kernel reads its inputs once from
// memory. A row of C <= a few thousand floats stays in L1 between the statistics pass and the output
// pass, so "two passes over the row" costs no extra memory traffic. Loops are `omp simd` (AVX-512 with
// -march=native); rows are spread over threads with parallel_for.
#include "backends/cpu/norm.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "backends/cpu/simd_math.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

using simd::load;
using simd::store;

// Rows per parallel_for chunk in the forward kernels: ~32 KiB of f32 input per chunk.
int64_t forward_row_grain(int64_t C) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)); }

// Row chunks for parameter-gradient partial sums. At most 64 chunks, so the [chunks, C] partials stay
// small (344 KiB at C=1344) while leaving work for up to 64 threads. Depends only on the row count,
// never on the thread count: that is what makes dweight/dbias bitwise reproducible.
struct RowChunks {
  int64_t rows_per_chunk;
  int64_t count;
};
RowChunks param_grad_chunks(int64_t rows) {
  const int64_t per = std::max<int64_t>(1, (rows + 63) / 64);
  return {per, (rows + per - 1) / per};
}

// out[j] = sum over c (in chunk order) of partial[c*C + j].
void sum_partials(float* out, const float* partial, int64_t chunks, int64_t C) {
  parallel_for(0, C, 1024, [&](int64_t j0, int64_t j1) {
#pragma omp simd simdlen(16)
    for (int64_t j = j0; j < j1; ++j) out[j] = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = partial + c * C;
#pragma omp simd simdlen(16)
      for (int64_t j = j0; j < j1; ++j) out[j] += p[j];
    }
  });
}

template <typename T>
float max_abs(const T* x, int64_t C) {
  float m = 0.0f;
  for (int64_t j = 0; j < C; ++j) m = std::max(m, std::fabs(load(x, j)));
  return m;
}

// rstd of a row whose sum of squares overflowed f32: normalise by m = max|x| first.
// mean(x^2) = m^2 * mean((x/m)^2), so rstd = (1/m) / sqrt(mean((x/m)^2) + eps/m^2).
template <typename T>
float scaled_rms_rstd(const T* x, int64_t C, float eps, float unscaled) {
  const float m = max_abs(x, C);
  if (!std::isfinite(m) || m == 0.0f) return unscaled;  // inf/NaN inputs: let them propagate
  const float inv = 1.0f / m;
  float ss = 0.0f;
  for (int64_t j = 0; j < C; ++j) {
    const float v = load(x, j) * inv;
    ss += v * v;
  }
  return inv / std::sqrt(ss / static_cast<float>(C) + eps * inv * inv);
}

// TY may differ from T: an f32 x normalised into a bf16 y for the bf16 GEMMs that read it (rounded
// once on store, the value x.to(bf16) of the f32 y would have).
template <typename T, typename TY = T>
void rms_norm_forward_impl(TY* y, float* rstd, const T* x, const float* weight, int64_t rows, int64_t C,
                           float eps) {
  parallel_for(0, rows, forward_row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      TY* yr = y + r * C;
      float ss = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : ss)
      for (int64_t j = 0; j < C; ++j) {
        const float v = load(xr, j);
        ss += v * v;
      }
      float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      if (!(ss <= FLT_MAX)) [[unlikely]] rs = scaled_rms_rstd(xr, C, eps, rs);
      if (rstd != nullptr) rstd[r] = rs;
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < C; ++j) store(yr, j, load(xr, j) * rs * weight[j]);
    }
  });
}

// sum = x + residual, stored (rounded to T) and then normalised as stored, so that the backward, which
// sees only the saved sum, differentiates exactly what the forward computed.
template <typename T, typename TY = T>
void add_rms_norm_forward_impl(T* sum, TY* y, float* rstd, const T* x, const T* residual, const float* weight,
                               int64_t rows, int64_t C, float eps) {
  parallel_for(0, rows, forward_row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      const T* rr = residual + r * C;
      T* sr = sum + r * C;
      TY* yr = y + r * C;
      float ss = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : ss)
      for (int64_t j = 0; j < C; ++j) {
        store(sr, j, load(xr, j) + load(rr, j));
        const float v = load(sr, j);
        ss += v * v;
      }
      float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      if (!(ss <= FLT_MAX)) [[unlikely]] rs = scaled_rms_rstd(sr, C, eps, rs);
      if (rstd != nullptr) rstd[r] = rs;
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < C; ++j) store(yr, j, load(sr, j) * rs * weight[j]);
    }
  });
}

// With kAddGrad, dx += dsum as well (the fused residual add's backward: d(sum) = upstream + norm's dx).
template <bool kAddGrad, typename T>
void rms_norm_backward_impl(T* dx, float* dweight, const T* dy, const T* x, const float* weight,
                            const float* rstd, int64_t rows, int64_t C, const T* dsum = nullptr) {
  const RowChunks chunks = param_grad_chunks(rows);
  std::vector<float> partial(dweight != nullptr ? static_cast<size_t>(chunks.count * C) : 0);
  parallel_for(0, chunks.count, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* pw = dweight != nullptr ? partial.data() + c * C : nullptr;
      if (pw != nullptr) std::fill(pw, pw + C, 0.0f);
      const int64_t r_end = std::min(rows, (c + 1) * chunks.rows_per_chunk);
      for (int64_t r = c * chunks.rows_per_chunk; r < r_end; ++r) {
        const T* xr = x + r * C;
        const T* dyr = dy + r * C;
        const float rs = rstd[r];
        if (dx != nullptr) {
          // dot = mean(g * xhat) with g = dy*w, xhat = x*rs; rs is applied per element (not as rs^3 on
          // the sum) so that rows with |x| ~ 1e20 neither overflow nor underflow.
          float gx = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : gx)
          for (int64_t j = 0; j < C; ++j) gx += load(dyr, j) * weight[j] * (load(xr, j) * rs);
          const float dot = gx / static_cast<float>(C);
          T* dxr = dx + r * C;
          const T* dsr = kAddGrad ? dsum + r * C : nullptr;
          if (pw != nullptr) {
#pragma omp simd simdlen(16)
            for (int64_t j = 0; j < C; ++j) {
              const float xhat = load(xr, j) * rs, dyv = load(dyr, j);
              float v = rs * (dyv * weight[j] - xhat * dot);
              if constexpr (kAddGrad) v += load(dsr, j);
              store(dxr, j, v);
              pw[j] += dyv * xhat;
            }
          } else {
#pragma omp simd simdlen(16)
            for (int64_t j = 0; j < C; ++j) {
              float v = rs * (load(dyr, j) * weight[j] - load(xr, j) * rs * dot);
              if constexpr (kAddGrad) v += load(dsr, j);
              store(dxr, j, v);
            }
          }
        } else if (pw != nullptr) {
#pragma omp simd simdlen(16)
          for (int64_t j = 0; j < C; ++j) pw[j] += load(dyr, j) * (load(xr, j) * rs);
        }
      }
    }
  });
  if (dweight != nullptr) sum_partials(dweight, partial.data(), chunks.count, C);
}

// Mean and rstd of a row whose sums overflowed f32: the same corrected two-pass algorithm on x/m,
// m = max|x|, then mean = m * mean(x/m) and rstd = (1/m) / sqrt(var(x/m) + eps/m^2).
template <typename T>
void scaled_layer_norm_stats(const T* x, int64_t C, float eps, float& mean, float& rs) {
  const float m = max_abs(x, C);
  if (!std::isfinite(m) || m == 0.0f) return;  // inf/NaN inputs: keep the unscaled (non-finite) stats
  const float inv = 1.0f / m;
  float s = 0.0f;
  for (int64_t j = 0; j < C; ++j) s += load(x, j) * inv;
  float ms = s / static_cast<float>(C);
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t j = 0; j < C; ++j) {
    const float d = load(x, j) * inv - ms;
    s1 += d;
    s2 += d * d;
  }
  const float c1 = s1 / static_cast<float>(C);
  const float var = std::max(0.0f, s2 / static_cast<float>(C) - c1 * c1);
  ms += c1;
  mean = ms * m;
  rs = inv / std::sqrt(var + eps * inv * inv);
}

template <typename T, typename TY = T>
void layer_norm_forward_impl(TY* y, float* mean, float* rstd, const T* x, const float* weight,
                             const float* bias, int64_t rows, int64_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  parallel_for(0, rows, forward_row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      TY* yr = y + r * C;
      float s = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s)
      for (int64_t j = 0; j < C; ++j) s += load(xr, j);
      float m = s * inv_c;
      // Corrected two-pass variance (Chan, Golub & LeVeque 1983): subtracting the rounding error of the
      // mean, (sum d)^2 / C, keeps var accurate when |mean| >> std (e.g. x = 1e4 + noise).
      float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s1, s2)
      for (int64_t j = 0; j < C; ++j) {
        const float d = load(xr, j) - m;
        s1 += d;
        s2 += d * d;
      }
      float c1 = s1 * inv_c;
      const float var = std::max(0.0f, s2 * inv_c - c1 * c1);
      float rs = 1.0f / std::sqrt(var + eps);
      if (!(s2 <= FLT_MAX) || !(std::fabs(s) <= FLT_MAX)) [[unlikely]] {
        scaled_layer_norm_stats(xr, C, eps, m, rs);
        c1 = 0.0f;
      }
      // The mean is m + c1, but that sum rounds to the f32 grid of |mean| (1e-3 at 1e4), an error that
      // (x - mean) would then carry; x - m is exact for x near m, so subtract the two parts separately.
      if (mean != nullptr) mean[r] = m + c1;
      if (rstd != nullptr) rstd[r] = rs;
      if (bias != nullptr) {
#pragma omp simd simdlen(16)
        for (int64_t j = 0; j < C; ++j) store(yr, j, ((load(xr, j) - m) - c1) * rs * weight[j] + bias[j]);
      } else {
#pragma omp simd simdlen(16)
        for (int64_t j = 0; j < C; ++j) store(yr, j, ((load(xr, j) - m) - c1) * rs * weight[j]);
      }
    }
  });
}

template <typename T>
void layer_norm_backward_impl(T* dx, float* dweight, float* dbias, const T* dy, const T* x, const float* weight,
                              const float* mean, const float* rstd, int64_t rows, int64_t C) {
  const RowChunks chunks = param_grad_chunks(rows);
  const size_t partial_size = static_cast<size_t>(chunks.count * C);
  std::vector<float> partial_w(dweight != nullptr ? partial_size : 0);
  std::vector<float> partial_b(dbias != nullptr ? partial_size : 0);
  const float inv_c = 1.0f / static_cast<float>(C);
  parallel_for(0, chunks.count, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* pw = dweight != nullptr ? partial_w.data() + c * C : nullptr;
      float* pb = dbias != nullptr ? partial_b.data() + c * C : nullptr;
      if (pw != nullptr) std::fill(pw, pw + C, 0.0f);
      if (pb != nullptr) std::fill(pb, pb + C, 0.0f);
      const int64_t r_end = std::min(rows, (c + 1) * chunks.rows_per_chunk);
      for (int64_t r = c * chunks.rows_per_chunk; r < r_end; ++r) {
        const T* xr = x + r * C;
        const T* dyr = dy + r * C;
        const float m = mean[r], rs = rstd[r];
        // The saved mean is rounded to f32; corr = mean(x - m) recovers the rest (see the forward), so
        // xhat = ((x - m) - corr) * rs. One extra sum over a row that is in L1 anyway.
        float sd = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sd)
        for (int64_t j = 0; j < C; ++j) sd += load(xr, j) - m;
        const float corr = std::isfinite(sd) ? sd * inv_c : 0.0f;
        if (dx != nullptr) {
          float sg = 0.0f, sgx = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sg, sgx)
          for (int64_t j = 0; j < C; ++j) {
            const float g = load(dyr, j) * weight[j];
            sg += g;
            sgx += g * (((load(xr, j) - m) - corr) * rs);
          }
          const float a = sg * inv_c;   // mean(g)
          const float b = sgx * inv_c;  // mean(g * xhat)
          T* dxr = dx + r * C;
#pragma omp simd simdlen(16)
          for (int64_t j = 0; j < C; ++j) {
            const float xhat = ((load(xr, j) - m) - corr) * rs;
            store(dxr, j, rs * (load(dyr, j) * weight[j] - a - xhat * b));
          }
        }
        if (pw != nullptr) {
#pragma omp simd simdlen(16)
          for (int64_t j = 0; j < C; ++j) pw[j] += load(dyr, j) * (((load(xr, j) - m) - corr) * rs);
        }
        if (pb != nullptr) {
#pragma omp simd simdlen(16)
          for (int64_t j = 0; j < C; ++j) pb[j] += load(dyr, j);
        }
      }
    }
  });
  if (dweight != nullptr) sum_partials(dweight, partial_w.data(), chunks.count, C);
  if (dbias != nullptr) sum_partials(dbias, partial_b.data(), chunks.count, C);
}

}  // namespace

void rms_norm_forward(float* y, float* rstd, const float* x, const float* weight, int64_t rows, int64_t C,
                      float eps) {
  rms_norm_forward_impl(y, rstd, x, weight, rows, C, eps);
}
void rms_norm_forward(bf16* y, float* rstd, const bf16* x, const float* weight, int64_t rows, int64_t C,
                      float eps) {
  rms_norm_forward_impl(y, rstd, x, weight, rows, C, eps);
}
void rms_norm_forward(bf16* y, float* rstd, const float* x, const float* weight, int64_t rows, int64_t C,
                      float eps) {
  rms_norm_forward_impl(y, rstd, x, weight, rows, C, eps);
}
void rms_norm_backward(float* dx, float* dweight, const float* dy, const float* x, const float* weight,
                       const float* rstd, int64_t rows, int64_t C) {
  rms_norm_backward_impl<false>(dx, dweight, dy, x, weight, rstd, rows, C);
}
void rms_norm_backward(bf16* dx, float* dweight, const bf16* dy, const bf16* x, const float* weight,
                       const float* rstd, int64_t rows, int64_t C) {
  rms_norm_backward_impl<false>(dx, dweight, dy, x, weight, rstd, rows, C);
}

void add_rms_norm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps) {
  add_rms_norm_forward_impl(sum, y, rstd, x, residual, weight, rows, C, eps);
}
void add_rms_norm_forward(bf16* sum, bf16* y, float* rstd, const bf16* x, const bf16* residual,
                          const float* weight, int64_t rows, int64_t C, float eps) {
  add_rms_norm_forward_impl(sum, y, rstd, x, residual, weight, rows, C, eps);
}
void add_rms_norm_forward(float* sum, bf16* y, float* rstd, const float* x, const float* residual,
                          const float* weight, int64_t rows, int64_t C, float eps) {
  add_rms_norm_forward_impl(sum, y, rstd, x, residual, weight, rows, C, eps);
}
void add_rms_norm_backward(float* dsum_total, float* dweight, const float* dy, const float* dsum, const float* sum,
                           const float* weight, const float* rstd, int64_t rows, int64_t C) {
  rms_norm_backward_impl<true>(dsum_total, dweight, dy, sum, weight, rstd, rows, C, dsum);
}
void add_rms_norm_backward(bf16* dsum_total, float* dweight, const bf16* dy, const bf16* dsum, const bf16* sum,
                           const float* weight, const float* rstd, int64_t rows, int64_t C) {
  rms_norm_backward_impl<true>(dsum_total, dweight, dy, sum, weight, rstd, rows, C, dsum);
}

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps) {
  layer_norm_forward_impl(y, mean, rstd, x, weight, bias, rows, C, eps);
}
void layer_norm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps) {
  layer_norm_forward_impl(y, mean, rstd, x, weight, bias, rows, C, eps);
}
void layer_norm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int64_t rows, int64_t C, float eps) {
  layer_norm_forward_impl(y, mean, rstd, x, weight, bias, rows, C, eps);
}
void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C) {
  layer_norm_backward_impl(dx, dweight, dbias, dy, x, weight, mean, rstd, rows, C);
}
void layer_norm_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                         const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C) {
  layer_norm_backward_impl(dx, dweight, dbias, dy, x, weight, mean, rstd, rows, C);
}

// ---- naive double-precision oracles --------------------------------------------------------------

void rms_norm_forward_reference(float* y, float* rstd, const float* x, const float* weight, int64_t rows,
                                int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < C; ++j) ss += static_cast<double>(x[r * C + j]) * x[r * C + j];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    if (rstd != nullptr) rstd[r] = static_cast<float>(rs);
    for (int64_t j = 0; j < C; ++j) y[r * C + j] = static_cast<float>(x[r * C + j] * rs * weight[j]);
  }
}

void rms_norm_backward_reference(float* dx, float* dweight, const float* dy, const float* x,
                                 const float* weight, int64_t rows, int64_t C, float eps) {
  std::vector<double> dw(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    double ss = 0;
    for (int64_t j = 0; j < C; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    double dot = 0;  // mean(g * xhat)
    for (int64_t j = 0; j < C; ++j) dot += static_cast<double>(dyr[j]) * weight[j] * xr[j] * rs;
    dot /= static_cast<double>(C);
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = xr[j] * rs;
      if (dx != nullptr) dx[r * C + j] = static_cast<float>(rs * (static_cast<double>(dyr[j]) * weight[j] - xhat * dot));
      dw[static_cast<size_t>(j)] += dyr[j] * xhat;
    }
  }
  if (dweight != nullptr) {
    for (int64_t j = 0; j < C; ++j) dweight[j] = static_cast<float>(dw[static_cast<size_t>(j)]);
  }
}

void layer_norm_forward_reference(float* y, float* mean, float* rstd, const float* x, const float* weight,
                                  const float* bias, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    double m = 0;
    for (int64_t j = 0; j < C; ++j) m += xr[j];
    m /= static_cast<double>(C);
    double var = 0;
    for (int64_t j = 0; j < C; ++j) var += (xr[j] - m) * (xr[j] - m);
    var /= static_cast<double>(C);
    const double rs = 1.0 / std::sqrt(var + eps);
    if (mean != nullptr) mean[r] = static_cast<float>(m);
    if (rstd != nullptr) rstd[r] = static_cast<float>(rs);
    for (int64_t j = 0; j < C; ++j) {
      y[r * C + j] = static_cast<float>((xr[j] - m) * rs * weight[j] + (bias != nullptr ? bias[j] : 0.0f));
    }
  }
}

void layer_norm_backward_reference(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                                   const float* weight, int64_t rows, int64_t C, float eps) {
  std::vector<double> dw(static_cast<size_t>(C), 0.0), db(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    double m = 0;
    for (int64_t j = 0; j < C; ++j) m += xr[j];
    m /= static_cast<double>(C);
    double var = 0;
    for (int64_t j = 0; j < C; ++j) var += (xr[j] - m) * (xr[j] - m);
    var /= static_cast<double>(C);
    const double rs = 1.0 / std::sqrt(var + eps);
    double a = 0, b = 0;  // mean(g), mean(g * xhat)
    for (int64_t j = 0; j < C; ++j) {
      const double g = static_cast<double>(dyr[j]) * weight[j];
      a += g;
      b += g * (xr[j] - m) * rs;
    }
    a /= static_cast<double>(C);
    b /= static_cast<double>(C);
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xr[j] - m) * rs;
      if (dx != nullptr) dx[r * C + j] = static_cast<float>(rs * (static_cast<double>(dyr[j]) * weight[j] - a - xhat * b));
      dw[static_cast<size_t>(j)] += dyr[j] * xhat;
      db[static_cast<size_t>(j)] += dyr[j];
    }
  }
  for (int64_t j = 0; j < C; ++j) {
    if (dweight != nullptr) dweight[j] = static_cast<float>(dw[static_cast<size_t>(j)]);
    if (dbias != nullptr) dbias[j] = static_cast<float>(db[static_cast<size_t>(j)]);
  }
}

}  // namespace loom::cpu
