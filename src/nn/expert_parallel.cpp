#include "nn/expert_parallel.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "nn/sharded.h"
#include "ops/collective.h"
#include "ops/moe.h"

namespace loom::dist {
namespace {

// rows [P, C]: rows[row_of_slot[s]] = x[s / K]. Backward: dx[n] = sum over k, in k order, of
// drows[row_of_slot[n*K + k]] (the order ops::moe_experts sums a token's slots in).
Tensor gather_slot_rows(const Tensor& x, const std::vector<int32_t>& row_of_slot, int64_t K) {
  const int64_t N = x.size(0), C = x.size(1), P = N * K;
  Tensor rows = Tensor::empty({P, C});
  const float* src = x.data<float>();
  float* dst = rows.data<float>();
  for (int64_t s = 0; s < P; ++s) {
    std::memcpy(dst + static_cast<int64_t>(row_of_slot[static_cast<size_t>(s)]) * C, src + (s / K) * C,
                static_cast<size_t>(C) * sizeof(float));
  }
  autograd::record("expert_gather_slot_rows", {x}, {rows}, [row_of_slot, N, C, K](const autograd::BackwardContext& ctx) {
    const float* g = ctx.grad_output(0).data<float>();
    Tensor dx = Tensor::empty({N, C});
    float* d = dx.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      float* dn = d + n * C;
      for (int64_t k = 0; k < K; ++k) {
        const float* r = g + static_cast<int64_t>(row_of_slot[static_cast<size_t>(n * K + k)]) * C;
        for (int64_t c = 0; c < C; ++c) dn[c] = k == 0 ? r[c] : dn[c] + r[c];
      }
      if (K == 0) std::fill(dn, dn + C, 0.0f);
    }
    return TensorList{dx};
  });
  return rows;
}

// y[n] = sum over k, in k order, of gates[n,k] * rows[row_of_slot[n*K + k]]: the combine of
// ops::moe_experts. rows: [P, C]; gates: [N, K] -> [N, C].
Tensor combine_slot_rows(const Tensor& rows, const std::vector<int32_t>& row_of_slot, const Tensor& gates) {
  const int64_t N = gates.size(0), K = gates.size(1), C = rows.size(1);
  Tensor y = Tensor::empty({N, C});
  const float* src = rows.data<float>();
  const float* g = gates.data<float>();
  float* dst = y.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* yn = dst + n * C;
    for (int64_t k = 0; k < K; ++k) {
      const float gk = g[n * K + k];
      const float* r = src + static_cast<int64_t>(row_of_slot[static_cast<size_t>(n * K + k)]) * C;
      if (k == 0) {
        for (int64_t c = 0; c < C; ++c) yn[c] = gk * r[c];
      } else {
        for (int64_t c = 0; c < C; ++c) yn[c] += gk * r[c];
      }
    }
    if (K == 0) std::fill(yn, yn + C, 0.0f);
  }
  const Tensor rows_saved = rows.detach(), gates_saved = gates.detach();
  autograd::record("expert_combine_slot_rows", {rows, gates}, {y},
                   [rows_saved, gates_saved, row_of_slot, N, K, C](const autograd::BackwardContext& ctx) {
                     const float* dy = ctx.grad_output(0).data<float>();
                     const float* r = rows_saved.data<float>();
                     const float* g = gates_saved.data<float>();
                     Tensor drows, dgates;
                     if (ctx.needs_input_grad(0)) drows = Tensor::empty({N * K, C});
                     if (ctx.needs_input_grad(1)) dgates = Tensor::empty({N, K});
                     for (int64_t n = 0; n < N; ++n) {
                       const float* dyn = dy + n * C;
                       for (int64_t k = 0; k < K; ++k) {
                         const int64_t row = row_of_slot[static_cast<size_t>(n * K + k)];
                         if (drows.defined()) {
                           float* d = drows.data<float>() + row * C;
                           const float gk = g[n * K + k];
                           for (int64_t c = 0; c < C; ++c) d[c] = gk * dyn[c];
                         }
                         if (dgates.defined()) {
                           double acc = 0;
                           const float* rr = r + row * C;
                           for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(dyn[c]) * rr[c];
                           dgates.data<float>()[n * K + k] = static_cast<float>(acc);
                         }
                       }
                     }
                     return TensorList{drows, dgates};
                   });
  return y;
}

}  // namespace

Tensor expert_parallel_experts(const Tensor& x, const Tensor& expert_index, const Tensor& gates,
                               const nn::Parameter& w1, const nn::Parameter& w3, const nn::Parameter& w2,
                               ops::MatmulPrecision precision) {
  LOOM_ASSERT(w1.dist && is_split_over(w1, MeshAxis::Expert), "expert_parallel_experts: '", w1.name,
              "' is not split over the expert axis");
  const RankContext& c = *w1.dist;
  check_dtype(x, DType::F32, "expert_parallel_experts", "x");
  check_dtype(expert_index, DType::I32, "expert_parallel_experts", "expert_index");
  check_ndim(x, 2, "expert_parallel_experts", "x");
  const Group group = c.group(MeshAxis::Expert);
  const int64_t G = group.size(), N = x.size(0), K = expert_index.size(1), P = N * K;
  const int64_t El = w1.value.size(0), E = El * G;
  LOOM_CHECK(expert_index.size(0) == N && gates.shape() == expert_index.shape(), "expert_parallel_experts: x ",
             x.describe(), ", expert_index ", expert_index.describe(), " and gates ", gates.describe(), " disagree");

  // 1. Slots ordered by destination rank (a stable counting sort), and each row's local expert id.
  const int32_t* idx = expert_index.data<int32_t>();
  std::vector<int64_t> send_rows(static_cast<size_t>(G), 0);
  for (int64_t s = 0; s < P; ++s) {
    LOOM_CHECK(idx[s] >= 0 && idx[s] < E, "expert_parallel_experts: expert_index[", s / K, ", ", s % K, "] = ", idx[s],
               " is outside [0, ", E, ")");
    ++send_rows[static_cast<size_t>(idx[s] / El)];
  }
  std::vector<int64_t> next(static_cast<size_t>(G), 0);
  for (int64_t g = 1; g < G; ++g) next[static_cast<size_t>(g)] = next[static_cast<size_t>(g - 1)] + send_rows[static_cast<size_t>(g - 1)];
  std::vector<int32_t> row_of_slot(static_cast<size_t>(P));
  Tensor local_ids = Tensor::empty({P, 1});  // f32: small integers travel exactly with the rows' transport
  for (int64_t s = 0; s < P; ++s) {
    const int64_t row = next[static_cast<size_t>(idx[s] / El)]++;
    row_of_slot[static_cast<size_t>(s)] = static_cast<int32_t>(row);
    local_ids.data<float>()[row] = static_cast<float>(idx[s] % El);
  }

  // 2. Counts first, then the rows.
  const std::vector<int64_t> recv_rows = ops::exchange_counts(send_rows, group);
  int64_t M = 0;
  for (int64_t r : recv_rows) M += r;
  if (c.max_expert_rows > 0 && M > c.max_expert_rows) {
    std::string from;
    for (int64_t g = 0; g < G; ++g) from += (g ? ", " : "") + std::to_string(recv_rows[static_cast<size_t>(g)]);
    LOOM_FAIL("expert parallelism: rank ", c.rank, " would receive ", M, " token rows for its experts ", c.coord(MeshAxis::Expert) * El,
              "..", (c.coord(MeshAxis::Expert) + 1) * El - 1, " in one MoE layer (from the expert group's members: ", from,
              "), over the cap of ", c.max_expert_rows,
              " rows (parallel.max_expert_rows): the routing is that imbalanced; raise the cap, or lower the batch");
  }
  Tensor x_recv = ops::all_to_all(gather_slot_rows(x, row_of_slot, K), send_rows, recv_rows, group);  // [M, C]
  Tensor ids_recv;
  {
    autograd::NoGradGuard no_grad;
    ids_recv = ops::all_to_all(local_ids, send_rows, recv_rows, group);  // [M, 1]
  }
  Tensor index = Tensor::empty({M, 1}, DType::I32);
  for (int64_t m = 0; m < M; ++m) index.data<int32_t>()[m] = static_cast<int32_t>(ids_recv.data<float>()[m]);

  // 3. This rank's experts on what it received, 4. the results back to their tokens' ranks, 5. combine.
  Tensor unit = Tensor::full({M, 1}, 1.0f);
  Tensor out = ops::moe_experts(x_recv, index, unit, data_gathered_value(w1), data_gathered_value(w3),
                                data_gathered_value(w2), precision);  // [M, C]
  Tensor back = ops::all_to_all(out, recv_rows, send_rows, group);    // [P, C]
  return combine_slot_rows(back, row_of_slot, gates);
}

}  // namespace loom::dist
