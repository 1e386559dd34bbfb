// Forward + backward of the norm/activation/dropout kernels at the benchmark model's activation sizes,
// [2048, 512] (d_model) and [2048, 1344] (FFN hidden), in GB/s of compulsory memory traffic:
//   rms_norm / layer_norm / silu / gelu: fwd reads x, writes y; bwd reads dy, x, writes dx   -> 5 tensors
//   swiglu: fwd reads gate, up, writes y; bwd reads dy, gate, up, writes dgate, dup          -> 8 tensors
//   dropout: fwd reads x, writes y; bwd reads dy, writes dx (the mask is recomputed)         -> 4 tensors
//   add_rms_norm: fwd reads x, residual, writes sum, y; bwd reads dy, dsum, sum, writes dx   -> 8 tensors
//     (AddThenRmsNorm does the same work unfused: add, rms_norm, and the separate sum of the two
//     gradients of `sum`; 11 tensors of traffic, but counted as 8 so that the GB/s compare directly)
// (the [C]/[R] parameter and statistics traffic is ignored). These ops are memory-bound, so compare the
// GB/s with BM_Copy, the same machine's read+write bandwidth at the same size.
//
// Kernel/* call the CPU kernels directly; Op/* go through the ops and autograd (output allocation from
// the caching allocator, graph recording, and the engine's copy of a leaf's gradient into .grad, which
// adds 2 tensors of traffic that is not counted).
//
//   OMP_NUM_THREADS=1 ./build/bench/loom_bench_norm --benchmark_min_time=0.05 --benchmark_repetitions=10
// On a shared machine quote the best repetition of each (others' jobs only ever add time): wall-clock
// time is measured, and with 2 cores and a busy neighbour a second OpenMP thread mostly waits.
#include <benchmark/benchmark.h>

#include <cstring>

#include "backends/cpu/activation.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/norm.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/norm.h"

using namespace loom;

namespace {

Tensor randn(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  fill_normal(t.data<float>(), t.numel(), RngKey::from_seed(seed), 0, 0.0f, 1.0f);
  return t;
}

void set_bytes(benchmark::State& state, int64_t tensors) {
  const int64_t n = state.range(0) * state.range(1);
  state.SetBytesProcessed(state.iterations() * tensors * n * static_cast<int64_t>(sizeof(float)));
}

const RngKey kKey = RngKey::from_seed(7);

void BM_Copy(benchmark::State& state) {  // the bandwidth roof: read n floats, write n floats
  const int64_t n = state.range(0) * state.range(1);
  Tensor a = randn({n}, 1), b = Tensor::empty({n});
  for (auto _ : state) {
    std::memcpy(b.raw_data(), a.raw_data(), a.nbytes());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2);
}

// ---- kernels -------------------------------------------------------------------------------------

void BM_KernelRmsNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Tensor x = randn({R, C}, 1), w = randn({C}, 2), dy = randn({R, C}, 3);
  Tensor y = Tensor::empty({R, C}), rstd = Tensor::empty({R}), dx = Tensor::empty({R, C}), dw = Tensor::empty({C});
  for (auto _ : state) {
    cpu::rms_norm_forward(y.data<float>(), rstd.data<float>(), x.data<float>(), w.data<float>(), R, C, 1e-5f);
    cpu::rms_norm_backward(dx.data<float>(), dw.data<float>(), dy.data<float>(), x.data<float>(), w.data<float>(),
                           rstd.data<float>(), R, C);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5);
}

void BM_KernelRmsNormBf16(benchmark::State& state) {  // bytes still counted as f32 for comparison
  const int64_t R = state.range(0), C = state.range(1);
  Tensor x = randn({R, C}, 1).to(DType::BF16), w = randn({C}, 2), dy = randn({R, C}, 3).to(DType::BF16);
  Tensor y = Tensor::empty({R, C}, DType::BF16), rstd = Tensor::empty({R}), dx = Tensor::empty({R, C}, DType::BF16),
         dw = Tensor::empty({C});
  for (auto _ : state) {
    cpu::rms_norm_forward(y.data<bf16>(), rstd.data<float>(), x.data<bf16>(), w.data<float>(), R, C, 1e-5f);
    cpu::rms_norm_backward(dx.data<bf16>(), dw.data<float>(), dy.data<bf16>(), x.data<bf16>(), w.data<float>(),
                           rstd.data<float>(), R, C);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5);
  state.SetLabel("bytes as f32; bf16 moves half");
}

void BM_KernelAddRmsNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Tensor x = randn({R, C}, 1), res = randn({R, C}, 5), w = randn({C}, 2), dy = randn({R, C}, 3), dsum = randn({R, C}, 6);
  Tensor sum = Tensor::empty({R, C}), y = Tensor::empty({R, C}), rstd = Tensor::empty({R}), dx = Tensor::empty({R, C}),
         dw = Tensor::empty({C});
  for (auto _ : state) {
    cpu::add_rms_norm_forward(sum.data<float>(), y.data<float>(), rstd.data<float>(), x.data<float>(),
                              res.data<float>(), w.data<float>(), R, C, 1e-5f);
    cpu::add_rms_norm_backward(dx.data<float>(), dw.data<float>(), dy.data<float>(), dsum.data<float>(),
                               sum.data<float>(), w.data<float>(), rstd.data<float>(), R, C);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 8);
}

void BM_KernelAddThenRmsNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Tensor x = randn({R, C}, 1), res = randn({R, C}, 5), w = randn({C}, 2), dy = randn({R, C}, 3), dsum = randn({R, C}, 6);
  Tensor sum = Tensor::empty({R, C}), y = Tensor::empty({R, C}), rstd = Tensor::empty({R}), dnorm = Tensor::empty({R, C}),
         dx = Tensor::empty({R, C}), dw = Tensor::empty({C});
  for (auto _ : state) {
    cpu::add_forward(sum.data<float>(), x.data<float>(), res.data<float>(), R * C);
    cpu::rms_norm_forward(y.data<float>(), rstd.data<float>(), sum.data<float>(), w.data<float>(), R, C, 1e-5f);
    cpu::rms_norm_backward(dnorm.data<float>(), dw.data<float>(), dy.data<float>(), sum.data<float>(), w.data<float>(),
                           rstd.data<float>(), R, C);
    cpu::add_forward(dx.data<float>(), dnorm.data<float>(), dsum.data<float>(), R * C);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 8);
}

void BM_KernelLayerNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Tensor x = randn({R, C}, 1), w = randn({C}, 2), b = randn({C}, 4), dy = randn({R, C}, 3);
  Tensor y = Tensor::empty({R, C}), mean = Tensor::empty({R}), rstd = Tensor::empty({R}), dx = Tensor::empty({R, C}),
         dw = Tensor::empty({C}), db = Tensor::empty({C});
  for (auto _ : state) {
    cpu::layer_norm_forward(y.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(), w.data<float>(),
                            b.data<float>(), R, C, 1e-5f);
    cpu::layer_norm_backward(dx.data<float>(), dw.data<float>(), db.data<float>(), dy.data<float>(), x.data<float>(),
                             w.data<float>(), mean.data<float>(), rstd.data<float>(), R, C);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5);
}

void BM_KernelSilu(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  Tensor x = randn({n}, 1), dy = randn({n}, 3), y = Tensor::empty({n}), dx = Tensor::empty({n});
  for (auto _ : state) {
    cpu::silu_forward(y.data<float>(), x.data<float>(), n);
    cpu::silu_backward(dx.data<float>(), dy.data<float>(), x.data<float>(), n);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5);
}

template <bool Tanh>
void BM_KernelGelu(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  Tensor x = randn({n}, 1), dy = randn({n}, 3), y = Tensor::empty({n}), dx = Tensor::empty({n});
  for (auto _ : state) {
    cpu::gelu_forward(y.data<float>(), x.data<float>(), n, Tanh);
    cpu::gelu_backward(dx.data<float>(), dy.data<float>(), x.data<float>(), n, Tanh);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5);
}

void BM_KernelSwiglu(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  Tensor g = randn({n}, 1), u = randn({n}, 2), dy = randn({n}, 3), y = Tensor::empty({n}), dg = Tensor::empty({n}),
         du = Tensor::empty({n});
  for (auto _ : state) {
    cpu::swiglu_forward(y.data<float>(), g.data<float>(), u.data<float>(), n);
    cpu::swiglu_backward(dg.data<float>(), du.data<float>(), dy.data<float>(), g.data<float>(), u.data<float>(), n);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 8);
}

void BM_KernelDropout(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  Tensor x = randn({n}, 1), dy = randn({n}, 3), y = Tensor::empty({n}), dx = Tensor::empty({n});
  for (auto _ : state) {
    cpu::dropout_forward(y.data<float>(), x.data<float>(), n, 0.1f, kKey);
    cpu::dropout_forward(dx.data<float>(), dy.data<float>(), n, 0.1f, kKey);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 4);
}

// ---- ops through autograd ------------------------------------------------------------------------

template <typename Forward>
void run_op(benchmark::State& state, TensorList leaves, Forward forward, int64_t tensors) {
  const int64_t R = state.range(0), C = state.range(1);
  Tensor dy = randn({R, C}, 99);
  for (Tensor& t : leaves) t.set_requires_grad();
  for (auto _ : state) {
    for (Tensor& t : leaves) t.set_grad(Tensor());
    autograd::backward(forward(leaves), dy);
    benchmark::DoNotOptimize(leaves[0].grad().raw_data());
  }
  set_bytes(state, tensors);
}

void BM_OpRmsNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  run_op(state, {randn({R, C}, 1), randn({C}, 2)}, [](const TensorList& in) { return ops::rms_norm(in[0], in[1]); }, 5);
}

void BM_OpLayerNorm(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  run_op(state, {randn({R, C}, 1), randn({C}, 2), randn({C}, 3)},
         [](const TensorList& in) { return ops::layer_norm(in[0], in[1], in[2]); }, 5);
}

void BM_OpGeluTanh(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  run_op(state, {randn({R, C}, 1)}, [](const TensorList& in) { return ops::gelu(in[0], ops::GeluApproximation::Tanh); }, 5);
}

void BM_OpSwiglu(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  run_op(state, {randn({R, C}, 1), randn({R, C}, 2)}, [](const TensorList& in) { return ops::swiglu(in[0], in[1]); }, 8);
}

void BM_OpDropout(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  run_op(state, {randn({R, C}, 1)}, [](const TensorList& in) { return ops::dropout(in[0], 0.1f, kKey); }, 4);
}

void sizes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 512})->Args({2048, 1344})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_Copy)->Apply(sizes);
BENCHMARK(BM_KernelRmsNorm)->Apply(sizes);
BENCHMARK(BM_KernelRmsNormBf16)->Apply(sizes);
BENCHMARK(BM_KernelAddRmsNorm)->Apply(sizes);
BENCHMARK(BM_KernelAddThenRmsNorm)->Apply(sizes);
BENCHMARK(BM_KernelLayerNorm)->Apply(sizes);
BENCHMARK(BM_KernelSilu)->Apply(sizes);
BENCHMARK(BM_KernelGelu<false>)->Apply(sizes);
BENCHMARK(BM_KernelGelu<true>)->Apply(sizes);
BENCHMARK(BM_KernelSwiglu)->Apply(sizes);
BENCHMARK(BM_KernelDropout)->Apply(sizes);
BENCHMARK(BM_OpRmsNorm)->Apply(sizes);
BENCHMARK(BM_OpLayerNorm)->Apply(sizes);
BENCHMARK(BM_OpGeluTanh)->Apply(sizes);
BENCHMARK(BM_OpSwiglu)->Apply(sizes);
BENCHMARK(BM_OpDropout)->Apply(sizes);

BENCHMARK_MAIN();
