// The routed experts of dsv3-mini against a dense SwiGLU with the same active FLOPs, forward + backward.
//
//   MoE:   N = 8*256 tokens, C = 384, E = 16 routed experts, K = 4 per token, F = 256 (d_expert):
//          ops::moe_experts, then backward for x, gates, w1, w3, w2.
//   Dense: the same x through a SwiGLU of hidden K*F = 1024 (ops::linear x3 + ops::swiglu), backward for
//          x and the three weights. Both do 3 GEMMs of 2*N*K*F*C flops forward and 6 backward.
// The ratio MoE / Dense is the overhead of sparse dispatch (gathers, the combine, tile-sized GEMMs,
// load imbalance). Routing is timed separately (it is a small [N, E] op).
//
// Routing: logits = x @ router^T with the seed's init (router std 0.02, x ~ N(0,1) as after RMSNorm),
// which spreads tokens fairly evenly; "skewed" adds 0.1*e to expert e's logit, so the top experts get
// several times their share (the loads are reported as counters min_load / max_load, in % of slots).
//
//   OMP_NUM_THREADS=2 ./build/bench/loom_bench_moe --benchmark_min_time=1 --benchmark_repetitions=5
// On a shared machine quote the best repetition (others' jobs only ever add time). The CPU column is the
// whole process's CPU time (all threads): on a loaded machine it is the steadier measure of the work
// done, while wall time also counts the time slices other jobs took.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/moe.h"

using namespace loom;

namespace {

constexpr int64_t kN = 8 * 256, kC = 384, kE = 16, kK = 4, kF = 256;

Tensor randn(const Shape& shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), RngKey::from_seed(seed), 0, 0.0f, std);
  return t;
}

Tensor leaf(Tensor t) {
  t.set_requires_grad();
  return t;
}

ops::MatmulPrecision precision_of(int64_t arg) {
  return arg == 0 ? ops::MatmulPrecision::F32 : ops::MatmulPrecision::BF16;
}

ops::MoeRouting make_routing(bool skewed, uint64_t seed = 1) {
  autograd::NoGradGuard no_grad;
  Tensor x = randn({kN, kC}, seed);
  Tensor logits = ops::linear(x, randn({kE, kC}, seed + 1000, 0.02f));
  if (skewed) {
    float* p = logits.data<float>();
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t e = 0; e < kE; ++e) p[n * kE + e] += 0.1f * static_cast<float>(e);
  }
  return ops::moe_route(logits, Tensor::zeros({kE}), kK, 1.0f);
}

void BM_MoeExperts(benchmark::State& state) {  // args: precision (0 f32, 1 bf16), skewed routing
  const auto precision = precision_of(state.range(0));
  const ops::MoeRouting r = make_routing(state.range(1) != 0);
  Tensor x = leaf(randn({kN, kC}, 3)), gates = leaf(r.gates.detach().clone());
  Tensor w1 = leaf(randn({kE, kF, kC}, 4, 0.02f)), w3 = leaf(randn({kE, kF, kC}, 5, 0.02f));
  Tensor w2 = leaf(randn({kE, kC, kF}, 6, 0.02f));
  Tensor dy = randn({kN, kC}, 7);
  for (auto _ : state) {
    Tensor y = ops::moe_experts(x, r.expert_index, gates, w1, w3, w2, precision);
    autograd::backward(y, dy);
    for (Tensor* t : {&x, &gates, &w1, &w3, &w2}) t->set_grad(Tensor());
  }
  auto load = r.expert_load.to_vector<int32_t>();
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  state.counters["min_load%"] = 100.0 * *lo / (kN * kK);
  state.counters["max_load%"] = 100.0 * *hi / (kN * kK);
  state.SetItemsProcessed(state.iterations() * kN);
}

// A new routing every iteration, as in training: the per-expert token counts (so the tile tails, so
// the GEMM shapes) change from step to step. The first sight of a tail size creates a oneDNN
// primitive; this measures what that costs while the cache fills (fixed 40 iterations, fresh process).
void BM_MoeExpertsNewRoutingEachStep(benchmark::State& state) {
  std::vector<ops::MoeRouting> routings;
  for (int i = 0; i < 40; ++i) routings.push_back(make_routing(false, 100 + static_cast<uint64_t>(i)));
  Tensor x = leaf(randn({kN, kC}, 3));
  Tensor w1 = leaf(randn({kE, kF, kC}, 4, 0.02f)), w3 = leaf(randn({kE, kF, kC}, 5, 0.02f));
  Tensor w2 = leaf(randn({kE, kC, kF}, 6, 0.02f));
  Tensor dy = randn({kN, kC}, 7);
  size_t step = 0;
  for (auto _ : state) {
    const ops::MoeRouting& r = routings[step++ % routings.size()];
    Tensor gates = leaf(r.gates.detach().clone());
    Tensor y = ops::moe_experts(x, r.expert_index, gates, w1, w3, w2);
    autograd::backward(y, dy);
    for (Tensor* t : {&x, &w1, &w3, &w2}) t->set_grad(Tensor());
  }
  state.SetItemsProcessed(state.iterations() * kN);
}

void BM_DenseSwiGLU(benchmark::State& state) {  // args: precision; hidden K*F
  const auto precision = precision_of(state.range(0));
  const int64_t H = kK * kF;
  Tensor x = leaf(randn({kN, kC}, 3));
  Tensor w1 = leaf(randn({H, kC}, 4, 0.02f)), w3 = leaf(randn({H, kC}, 5, 0.02f)), w2 = leaf(randn({kC, H}, 6, 0.02f));
  Tensor dy = randn({kN, kC}, 7);
  const auto out_in = ops::WeightLayout::OutIn;
  for (auto _ : state) {
    Tensor h =
        ops::swiglu(ops::linear(x, w1, Tensor(), out_in, precision), ops::linear(x, w3, Tensor(), out_in, precision));
    Tensor y = ops::linear(h, w2, Tensor(), out_in, precision);
    autograd::backward(y, dy);
    for (Tensor* t : {&x, &w1, &w3, &w2}) t->set_grad(Tensor());
  }
  state.SetItemsProcessed(state.iterations() * kN);
}

void BM_MoeRoute(benchmark::State& state) {  // routing fwd + bwd on [N, E] logits (plus the balance loss)
  Tensor logits = leaf(randn({kN, kE}, 8, 0.4f));
  Tensor dgates = randn({kN, kK}, 9);
  for (auto _ : state) {
    ops::MoeRouting r = ops::moe_route(logits, Tensor::zeros({kE}), kK, 1.0f);
    Tensor loss = ops::add(ops::sum(ops::mul(r.gates, dgates)), ops::moe_sequence_balance_loss(r, 8, 256, 1e-4f));
    autograd::backward(loss);
    logits.set_grad(Tensor());
  }
  state.SetItemsProcessed(state.iterations() * kN);
}

}  // namespace

BENCHMARK(BM_MoeExperts)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"bf16", "skewed"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(BM_MoeExpertsNewRoutingEachStep)
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(BM_DenseSwiGLU)
    ->Arg(0)
    ->Arg(1)
    ->ArgNames({"bf16"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(BM_MoeRoute)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_MAIN();
