// CPU kernels for the mixture-of-experts ops. Legend, layout and the determinism argument: see moe.h.
#include "backends/cpu/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>

#include "backends/cpu/gemm.h"
#include "backends/cpu/simd_math.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"

namespace loom::cpu {
namespace {

using simd::load;
using simd::store;

// A buffer from the caching allocator (core/allocator.h): uninitialised, and after the first step the
// same sizes come back from its free lists, so no step pays page faults for megabytes of scratch.
template <typename U>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t n)
      : storage_(std::make_unique<Storage>(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(U), Device::cpu())) {}
  U* get() const { return storage_ ? static_cast<U*>(storage_->data()) : nullptr; }
  explicit operator bool() const { return storage_ != nullptr; }

 private:
  std::unique_ptr<Storage> storage_;
};

// Copies one row of C values, converting to the destination's type (f32 -> bf16 rounds to nearest even).
template <typename S, typename D>
inline void copy_row(D* dst, const S* src, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) store(dst, c, load(src, c));
}

// a[i] = silu(h1[i]) * h3[i], rounded to the operand type.
template <typename T>
void swiglu_rows(T* a, const float* h1, const float* h3, int64_t n) {
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; ++i) store(a, i, h1[i] * simd::sigmoid(h1[i]) * h3[i]);
}

inline float sigmoid_exact(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// a ranks before b: larger, or a number where b is NaN (ties are left to the caller's index order).
inline bool ranks_before(float a, float b) { return a > b || (std::isnan(b) && !std::isnan(a)); }

}  // namespace

// ---- routing -------------------------------------------------------------------------------------

template <typename T>
void moe_route_forward(const T* logits, const float* bias, int64_t N, int64_t E, int64_t K, float route_scale,
                       int32_t* index, float* gates, float* affinity, int32_t* load_out) {
  parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) {
    std::vector<float> score(static_cast<size_t>(E));
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t n = n0; n < n1; ++n) {
      float* s = affinity + n * E;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = sigmoid_exact(load(logits, n * E + e));
        score[static_cast<size_t>(e)] = s[e] + bias[e];
        taken[static_cast<size_t>(e)] = 0;
      }
      // K passes of "the best not yet taken": scanning upward and replacing only on a strictly better
      // score leaves a tie with the lower index. K and E are small (4 of 16 in dsv3-mini).
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[static_cast<size_t>(e)]) continue;
          if (best < 0 || ranks_before(score[static_cast<size_t>(e)], score[static_cast<size_t>(best)])) best = e;
        }
        taken[static_cast<size_t>(best)] = 1;
        index[n * K + k] = static_cast<int32_t>(best);
        sum += s[best];
      }
      for (int64_t k = 0; k < K; ++k) gates[n * K + k] = s[index[n * K + k]] / sum * route_scale;
    }
  });
  for (int64_t e = 0; e < E; ++e) load_out[e] = 0;
  for (int64_t i = 0; i < N * K; ++i) ++load_out[index[i]];
}

template <typename T>
void moe_route_backward(T* dlogits, const float* dgates, const float* daffinity, const float* affinity,
                        const int32_t* index, int64_t N, int64_t E, int64_t K, float route_scale) {
  parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) {
    std::vector<float> ds(static_cast<size_t>(E));
    for (int64_t n = n0; n < n1; ++n) {
      const float* s = affinity + n * E;
      for (int64_t e = 0; e < E; ++e) ds[static_cast<size_t>(e)] = daffinity ? daffinity[n * E + e] : 0.0f;
      if (dgates != nullptr) {
        // g_k = rs * s_k / S  =>  dS/ds_j contributions: ds_j += rs/S * (dg_j - sum_k dg_k s_k / S).
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += s[index[n * K + k]];
        float weighted = 0.0f;
        for (int64_t k = 0; k < K; ++k) weighted += dgates[n * K + k] * s[index[n * K + k]];
        weighted /= sum;
        const float scale = route_scale / sum;
        for (int64_t k = 0; k < K; ++k)
          ds[static_cast<size_t>(index[n * K + k])] += scale * (dgates[n * K + k] - weighted);
      }
      for (int64_t e = 0; e < E; ++e) store(dlogits, n * E + e, ds[static_cast<size_t>(e)] * s[e] * (1.0f - s[e]));
    }
  });
}

template void moe_route_forward<float>(const float*, const float*, int64_t, int64_t, int64_t, float, int32_t*, float*,
                                       float*, int32_t*);
template void moe_route_forward<bf16>(const bf16*, const float*, int64_t, int64_t, int64_t, float, int32_t*, float*,
                                      float*, int32_t*);
template void moe_route_backward<float>(float*, const float*, const float*, const float*, const int32_t*, int64_t,
                                        int64_t, int64_t, float);
template void moe_route_backward<bf16>(bf16*, const float*, const float*, const float*, const int32_t*, int64_t,
                                       int64_t, int64_t, float);

// ---- routed experts: forward ---------------------------------------------------------------------

namespace {

void grouped(bool ta, bool tb, int64_t N, int64_t lda, int64_t ldb, float beta, int64_t ldc,
             const std::vector<GemmGroup>& groups, const float*) {
  gemm_grouped(ta, tb, N, 1.0f, lda, ldb, beta, ldc, groups);
}
void grouped(bool ta, bool tb, int64_t N, int64_t lda, int64_t ldb, float beta, int64_t ldc,
             const std::vector<GemmGroup>& groups, const bf16*) {
  gemm_grouped_bf16(ta, tb, N, 1.0f, lda, ldb, beta, ldc, groups);
}

// One group per expert: rows [offsets[e], offsets[e+1]). make(e, begin, rows) fills the group.
template <typename Make>
std::vector<GemmGroup> expert_groups(const MoeDispatch& d, Make&& make) {
  std::vector<GemmGroup> groups(static_cast<size_t>(d.E));
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t begin = d.offsets[static_cast<size_t>(e)], rows = d.offsets[static_cast<size_t>(e + 1)] - begin;
    groups[static_cast<size_t>(e)] = make(e, begin, rows);
  }
  return groups;
}

}  // namespace

template <typename T>
void moe_experts_forward(const MoeDispatch& d, const T* x, const float* gates, const T* w1, const T* w3, const T* w2,
                         int64_t C, int64_t F, float* y, float* h1, float* h3) {
  const int64_t N = d.N, K = d.K, P = N * K;
  const T* none = nullptr;
  // Scratch where the caller keeps no h1, h3 (inference); yp: [P,C] each slot's expert output, in row
  // order, which the combine below reads token by token; a: [P,F] silu(h1) * h3, the w2 GEMM's operand.
  Scratch<float> h1s = h1 != nullptr ? Scratch<float>() : Scratch<float>(P * F);
  Scratch<float> h3s = h3 != nullptr ? Scratch<float>() : Scratch<float>(P * F);
  float* ph1 = h1 != nullptr ? h1 : h1s.get();
  float* ph3 = h3 != nullptr ? h3 : h3s.get();
  Scratch<float> yp(P * C);
  Scratch<T> a(P * F);
  const int32_t* token = d.token_of_row.data();
  // h1 = x w1[e]^T, h3 = x w3[e]^T: [rows, F] per expert, x's rows gathered by the packing (no copy).
  for (const auto& [w, h] : {std::pair{w1, ph1}, std::pair{w3, ph3}}) {
    grouped(false, true, F, C, C, 0.0f, F, expert_groups(d, [&, w = w, h = h](int64_t e, int64_t begin, int64_t rows) {
              return GemmGroup{rows, C, x, w + e * F * C, h + begin * F, token + begin, nullptr};
            }),
            none);
  }
  parallel_for(0, P, 64, [&](int64_t r0, int64_t r1) {
    swiglu_rows(a.get() + r0 * F, ph1 + r0 * F, ph3 + r0 * F, (r1 - r0) * F);
  });
  grouped(false, true, C, F, F, 0.0f, C, expert_groups(d, [&](int64_t e, int64_t begin, int64_t rows) {
            return GemmGroup{rows, F, a.get() + begin * F, w2 + e * C * F, yp.get() + begin * C, nullptr, nullptr};
          }),
          none);
  // Combine: each token sums its K slots in k order (no scatter-add races, no order to depend on).
  parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* yn = y + n * C;
      for (int64_t k = 0; k < K; ++k) {
        const float g = gates[n * K + k];
        const float* src = yp.get() + static_cast<int64_t>(d.row_of_slot[static_cast<size_t>(n * K + k)]) * C;
        if (k == 0) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yn[c] = g * src[c];
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yn[c] += g * src[c];
        }
      }
      if (K == 0) std::fill(yn, yn + C, 0.0f);
    }
  });
}

// ---- routed experts: backward --------------------------------------------------------------------
//
// Per row p (slot s = token n, choice k, expert e), with a = silu(h1) * h3 and dy_n the token's gradient:
//   dau   = dy_n w2[e]                     [F]   (the gradient of a before the gate: computed once)
//   dgate = <dau, a>                        (= <dy_n, w2[e] a>: the expert outputs are not kept for backward)
//   dh1   = g dau * h3 * silu'(h1),  dh3 = g dau * silu(h1)
//   dxp   = dh1 w1[e] + dh3 w3[e]           [C]   -> dx_n = sum_k dxp(slot n,k)
//   dw1[e] = sum_p dh1_p^T x_n,  dw3[e] likewise,  dw2[e] = sum_p dy_n^T (g a_p)

template <typename T>
void moe_experts_backward(const MoeDispatch& d, const float* dy, const T* x, const float* gates, const T* w1,
                          const T* w3, const T* w2, const float* h1, const float* h3, int64_t C, int64_t F, float* dx,
                          float* dgates, float* dw1, float* dw3, float* dw2) {
  const int64_t N = d.N, K = d.K, P = N * K;
  const T* none = nullptr;
  const int32_t* token = d.token_of_row.data();
  const bool want_dh = dx != nullptr || dw1 != nullptr || dw3 != nullptr;
  // Row-ordered buffers (only those some output needs).
  auto maybe = [](bool wanted, int64_t n) { return wanted ? Scratch<T>(n) : Scratch<T>(); };
  const Scratch<T> dyp(P * C);                         // [P,C] gathered dy (before the gate), rounded to T
  const Scratch<float> dau(P * F);                     // [P,F] dy w2[e]
  const Scratch<T> dh1 = maybe(want_dh, P * F);        // [P,F]
  const Scratch<T> dh3 = maybe(want_dh, P * F);        // [P,F]
  const Scratch<T> ga = maybe(dw2 != nullptr, P * F);  // [P,F] g * a
  const Scratch<float> dxp = dx != nullptr ? Scratch<float>(P * C) : Scratch<float>();  // [P,C]

  parallel_for(0, P, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) copy_row(dyp.get() + r * C, dy + static_cast<int64_t>(token[r]) * C, C);
  });
  // dau = dy w2[e]: [rows, C] x [C, F].
  grouped(false, false, F, C, F, 0.0f, F, expert_groups(d, [&](int64_t e, int64_t begin, int64_t rows) {
            return GemmGroup{rows, C, dyp.get() + begin * C, w2 + e * C * F, dau.get() + begin * F, nullptr, nullptr};
          }),
          none);
  parallel_for(0, P, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t slot = d.slot_of_row[static_cast<size_t>(r)];
      const float g = gates[slot];
      const float* ph1 = h1 + r * F;
      const float* ph3 = h3 + r * F;
      const float* pda = dau.get() + r * F;
      T* pd1 = dh1 ? dh1.get() + r * F : nullptr;
      T* pd3 = dh3 ? dh3.get() + r * F : nullptr;
      T* pga = ga ? ga.get() + r * F : nullptr;
      // dgate = <dau, a> in a loop of its own, the same whichever gradients are wanted: the vectorizer
      // picks each loop's order of the sum, so a sum shared with the variants below gave different bits
      // for dgates alone and dgates beside dx (seen on a Zen 5).
      float dot = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : dot)
      for (int64_t f = 0; f < F; ++f) {
        const float s = simd::sigmoid(ph1[f]);
        dot += pda[f] * (ph1[f] * s * ph3[f]);
      }
      // The row's other outputs; the variants are separate loops so that none carries a branch.
      if (pga != nullptr && pd1 != nullptr) {
#pragma omp simd simdlen(16)
        for (int64_t f = 0; f < F; ++f) {
          const float s = simd::sigmoid(ph1[f]);
          const float silu = ph1[f] * s;
          const float a = silu * ph3[f];
          const float da = g * pda[f];
          store(pd1, f, da * ph3[f] * s * (1.0f + ph1[f] * (1.0f - s)));
          store(pd3, f, da * silu);
          store(pga, f, g * a);
        }
      } else if (pd1 != nullptr) {
#pragma omp simd simdlen(16)
        for (int64_t f = 0; f < F; ++f) {
          const float s = simd::sigmoid(ph1[f]);
          const float silu = ph1[f] * s;
          const float da = g * pda[f];
          store(pd1, f, da * ph3[f] * s * (1.0f + ph1[f] * (1.0f - s)));
          store(pd3, f, da * silu);
        }
      } else if (pga != nullptr) {
#pragma omp simd simdlen(16)
        for (int64_t f = 0; f < F; ++f) {
          const float s = simd::sigmoid(ph1[f]);
          store(pga, f, g * (ph1[f] * s * ph3[f]));
        }
      }
      if (dgates != nullptr) dgates[slot] = dot;
    }
  });
  if (dxp) {  // dxp = dh1 w1[e] + dh3 w3[e]: [rows, F] x [F, C], the second added with beta = 1
    grouped(false, false, C, F, C, 0.0f, C, expert_groups(d, [&](int64_t e, int64_t begin, int64_t rows) {
              return GemmGroup{rows, F, dh1.get() + begin * F, w1 + e * F * C, dxp.get() + begin * C, nullptr, nullptr};
            }),
            none);
    grouped(false, false, C, F, C, 1.0f, C, expert_groups(d, [&](int64_t e, int64_t begin, int64_t rows) {
              return GemmGroup{rows, F, dh3.get() + begin * F, w3 + e * F * C, dxp.get() + begin * C, nullptr, nullptr};
            }),
            none);
  }
  // Weight gradients, the expert's rows the reduction (an expert no token chose gets zeros):
  // dw1[e] = dh1^T x and dw3[e] = dh3^T x ([F, rows] x [rows, C], x's rows gathered by the packing),
  // dw2[e] = dy^T (g a) ([C, rows] x [rows, F]).
  for (const auto& [dw, dh] : {std::pair{dw1, dh1.get()}, std::pair{dw3, dh3.get()}}) {
    if (dw == nullptr) continue;
    grouped(true, false, C, F, C, 0.0f, C, expert_groups(d, [&, dw = dw, dh = dh](int64_t e, int64_t begin, int64_t rows) {
              return GemmGroup{F, rows, dh + begin * F, x, dw + e * F * C, nullptr, token + begin};
            }),
            none);
  }
  if (dw2 != nullptr) {
    grouped(true, false, F, C, F, 0.0f, F, expert_groups(d, [&](int64_t e, int64_t begin, int64_t rows) {
              return GemmGroup{C, rows, dyp.get() + begin * C, ga.get() + begin * F, dw2 + e * C * F, nullptr, nullptr};
            }),
            none);
  }

  if (dx != nullptr) {
    parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float* out = dx + n * C;
        std::fill(out, out + C, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const float* src = dxp.get() + static_cast<int64_t>(d.row_of_slot[static_cast<size_t>(n * K + k)]) * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) out[c] += src[c];
        }
      }
    });
  }
}

template void moe_experts_forward<float>(const MoeDispatch&, const float*, const float*, const float*, const float*,
                                         const float*, int64_t, int64_t, float*, float*, float*);
template void moe_experts_forward<bf16>(const MoeDispatch&, const bf16*, const float*, const bf16*, const bf16*,
                                        const bf16*, int64_t, int64_t, float*, float*, float*);
template void moe_experts_backward<float>(const MoeDispatch&, const float*, const float*, const float*, const float*,
                                          const float*, const float*, const float*, const float*, int64_t, int64_t,
                                          float*, float*, float*, float*, float*);
template void moe_experts_backward<bf16>(const MoeDispatch&, const float*, const bf16*, const float*, const bf16*,
                                         const bf16*, const bf16*, const float*, const float*, int64_t, int64_t, float*,
                                         float*, float*, float*, float*);

void moe_experts_forward_reference(const float* x, const int32_t* expert_index, const float* gates, const float* w1,
                                   const float* w3, const float* w2, int64_t N, int64_t C, int64_t F, int64_t E,
                                   int64_t K, float* y) {
  std::vector<double> gate_of(static_cast<size_t>(E)), a(static_cast<size_t>(F)), acc(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    std::fill(gate_of.begin(), gate_of.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) gate_of[static_cast<size_t>(expert_index[n * K + k])] += gates[n * K + k];
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t e = 0; e < E; ++e) {  // dense on purpose: unchosen experts run with gate 0
      for (int64_t f = 0; f < F; ++f) {
        double u = 0, v = 0;
        for (int64_t c = 0; c < C; ++c) {
          u += static_cast<double>(w1[(e * F + f) * C + c]) * x[n * C + c];
          v += static_cast<double>(w3[(e * F + f) * C + c]) * x[n * C + c];
        }
        a[static_cast<size_t>(f)] = u / (1.0 + std::exp(-u)) * v;
      }
      for (int64_t c = 0; c < C; ++c) {
        double o = 0;
        for (int64_t f = 0; f < F; ++f) o += static_cast<double>(w2[(e * C + c) * F + f]) * a[static_cast<size_t>(f)];
        acc[static_cast<size_t>(c)] += gate_of[static_cast<size_t>(e)] * o;
      }
    }
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = static_cast<float>(acc[static_cast<size_t>(c)]);
  }
}

// ---- sequence-wise balance loss ------------------------------------------------------------------

float moe_balance_loss_forward(const float* affinity, const int32_t* index, int64_t B, int64_t T, int64_t E, int64_t K,
                               float alpha, float* f) {
  std::vector<double> per_seq(static_cast<size_t>(B));
  parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<double> p(static_cast<size_t>(E));
    for (int64_t b = b0; b < b1; ++b) {
      float* fb = f + b * E;
      std::fill(fb, fb + E, 0.0f);
      std::fill(p.begin(), p.end(), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t;
        for (int64_t k = 0; k < K; ++k) fb[index[n * K + k]] += 1.0f;
        const float* s = affinity + n * E;
        double sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += s[e];
        for (int64_t e = 0; e < E; ++e) p[static_cast<size_t>(e)] += s[e] / sum;
      }
      const float scale = static_cast<float>(E) / static_cast<float>(K * T);  // 1.0 = perfectly even
      double loss = 0;
      for (int64_t e = 0; e < E; ++e) {
        fb[e] *= scale;
        loss += fb[e] * (p[static_cast<size_t>(e)] / static_cast<double>(T));
      }
      per_seq[static_cast<size_t>(b)] = loss;
    }
  });
  double total = 0;
  for (double v : per_seq) total += v;
  return static_cast<float>(alpha * total / static_cast<double>(B));
}

void moe_balance_loss_backward(float* daffinity, float dloss, const float* affinity, const float* f, int64_t B,
                               int64_t T, int64_t E, float alpha) {
  const double c = static_cast<double>(dloss) * alpha / (static_cast<double>(B) * static_cast<double>(T));
  parallel_for(0, B * T, 256, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* s = affinity + n * E;
      const float* fb = f + (n / T) * E;
      double sum = 0, fs = 0;
      for (int64_t e = 0; e < E; ++e) {
        sum += s[e];
        fs += static_cast<double>(fb[e]) * s[e];
      }
      for (int64_t e = 0; e < E; ++e) daffinity[n * E + e] = static_cast<float>(c * (fb[e] - fs / sum) / sum);
    }
  });
}

}  // namespace loom::cpu
