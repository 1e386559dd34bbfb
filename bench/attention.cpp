// Causal self-attention at the benchmark model's shape (B=8, T=256, H=16, D=32, RoPE), forward and
// forward+backward: the fused flash kernel against the composite reference (split_heads + rope +
// masked sdpa + merge_heads).
//
// FLOP convention: causal attention is counted as HALF of full attention (only the lower triangle is
// useful work): forward = 2 matmuls x 2*T*T*D / 2 = 2*B*H*T^2*D; backward = 4 matmuls = 4*B*H*T^2*D
// (the recomputation of the scores in the backward is not counted). fwd+bwd = 6*B*H*T^2*D = 1.61 GFLOP
// at the model shape. Threads: OMP_NUM_THREADS (or all cores).
// flash_dropout/*: the fused op with dropout p = 0.1 on the probabilities (GPT-2's attn_pdrop), same FLOP
// count (the Philox draws are not counted), so its GFLOP/s against flash/* is the cost of the mask.
//
//   OMP_NUM_THREADS=2 ./build/bench/loom_bench_attention
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/rope.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/attention.h"

using namespace loom;

namespace {

constexpr int64_t kB = 8, kT = 256, kH = 16, kD = 32;

Tensor randn(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), RngKey::from_seed(seed), 0, 0.0f, 1.0f);
  return t;
}

double causal_flops(int64_t b, int64_t t, int64_t h, int64_t d, bool backward) {
  const double fwd = 2.0 * b * h * t * t * d;
  return backward ? 3.0 * fwd : fwd;
}

template <bool kFused, bool kBackward, bool kDropout = false>
void BM_CausalSelfAttention(benchmark::State& state) {
  const int64_t t = state.range(0), d = state.range(1), c = kH * d;
  Tensor q = randn({kB, t, c}, 1), k = randn({kB, t, c}, 2), v = randn({kB, t, c}, 3);
  Tensor dy = randn({kB, t, c}, 4);
  Tensor pos = Tensor::empty({t}, DType::I32);
  for (int64_t i = 0; i < t; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(i);
  ops::RopeOptions rope{pos, 10000.0f, ops::RopeStyle::RotateHalf, {}};
  if (kBackward) {
    q.set_requires_grad();
    k.set_requires_grad();
    v.set_requires_grad();
  }
  const ops::AttentionDropout dropout{kDropout ? 0.1f : 0.0f, RngKey::from_seed(5)};
  for (auto _ : state) {
    Tensor y = kFused ? ops::causal_self_attention(q, k, v, kH, rope, 0, dropout)
                      : ops::causal_self_attention_reference(q, k, v, kH, rope, 0, dropout);
    if (kBackward) {
      autograd::backward(y, dy);
      q.set_grad(Tensor());
      k.set_grad(Tensor());
      v.set_grad(Tensor());
    }
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double flops = causal_flops(kB, t, kH, d, kBackward);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

// The kernels alone (no autograd engine, no leaf-gradient copies): what the fused op costs inside a
// model step, where q, k, v are activations rather than leaves. Third argument 1: bf16 products
// (AttentionProblem::bf16_products, as under --bf16), which run only where the CPU has AVX512-BF16:
// elsewhere the row repeats the f32 one, and says so in its label.
template <bool kBackward>
void BM_FlashKernels(benchmark::State& state) {
  const int64_t t = state.range(0), d = state.range(1), c = kH * d;
  const bool bf16 = state.range(2) != 0;
  Tensor q = randn({kB, t, c}, 1), k = randn({kB, t, c}, 2), v = randn({kB, t, c}, 3), dy = randn({kB, t, c}, 4);
  Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({kB * kH, t});
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(q.shape()), dv = Tensor::empty(q.shape());
  std::vector<int32_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::vector<float> cos(static_cast<size_t>(t * d / 2)), sin(cos.size());
  cpu::rope_tables(cos.data(), sin.data(), pos.data(), t, d, 10000.0f);
  AttentionProblem p;
  p.batches = kB;
  p.heads_per_batch = kH;
  p.tq = p.tk = t;
  p.d = p.dv = d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.causal = true;
  p.q = p.k = p.v = p.out = {t * c, d, c};
  p.rope = {cos.data(), sin.data(), 0, false};
  p.bf16_products = bf16;
  if (bf16) state.SetLabel(cpu::flash_attention_uses_bf16(p) ? "bf16 products" : "no AVX512-BF16: f32 products");
  for (auto _ : state) {
    cpu::flash_attention_forward(p, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                 lse.data<float>());
    if (kBackward)
      cpu::flash_attention_backward(p, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                    dy.data<float>(), lse.data<float>(), dq.data<float>(), dk.data<float>(),
                                    dv.data<float>());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      causal_flops(kB, t, kH, d, kBackward) * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_FlashKernels<false>)
    ->Name("kernel/forward")
    ->Args({kT, kD, 0})
    ->Args({kT, kD, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_FlashKernels<true>)
    ->Name("kernel/forward_backward")
    ->Args({kT, kD, 0})
    ->Args({kT, kD, 1})
    ->Args({kT, 64, 0})
    ->Args({kT, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<true, false>)
    ->Name("flash/forward")
    ->Args({kT, kD})
    ->Args({kT, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<true, true>)
    ->Name("flash/forward_backward")
    ->Args({kT, kD})
    ->Args({kT, 64})
    ->Args({1024, kD})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<true, false, true>)
    ->Name("flash_dropout/forward")
    ->Args({kT, kD})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<true, true, true>)
    ->Name("flash_dropout/forward_backward")
    ->Args({kT, kD})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<false, false>)
    ->Name("reference/forward")
    ->Args({kT, kD})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CausalSelfAttention<false, true>)
    ->Name("reference/forward_backward")
    ->Args({kT, kD})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
