// Each CUDA kernel against the CPU backend on the same random inputs, f32 and bf16, with tolerances by
// dtype. Skipped without a GPU; tools/device_check.sh runs them on a lent one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cuda/elementwise.h"
#include "backends/cuda/gemm.h"
#include "backends/row_sums.h"
#include "core/autograd.h"
#include "core/caching_allocator.h"
#include "core/step_capture.h"
#include "gpu_test.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "support/op_test.h"

using namespace loom;
using namespace loom::test;

TEST(CudaTensor, RoundTripsAreExactForEveryDtype) {
  LOOM_REQUIRE_GPU();
  Tensor f = random_cpu({3, 1000}, 1);
  for (DType t : {DType::F32, DType::BF16, DType::I32, DType::U16, DType::Bool}) {
    Tensor h = f.to(t);
    Tensor d = h.to(kGpu);
    EXPECT_EQ(d.device(), kGpu);
    Tensor back = d.clone().to(Device::cpu());  // through a device-to-device copy too
    ASSERT_EQ(back.nbytes(), h.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()), 0) << dtype_name(t);
  }
}

TEST(CudaTensor, FillZerosAndDtypeConversion) {
  LOOM_REQUIRE_GPU();
  Tensor d = Tensor::full({5, 7}, 3.5f, DType::F32, kGpu);
  for (float v : host_values(d)) EXPECT_EQ(v, 3.5f);
  d.zero_();
  for (float v : host_values(d)) EXPECT_EQ(v, 0.0f);
  Tensor x = random_cpu({1, 4097}, 2);
  Tensor on_gpu = x.to(kGpu).to(DType::BF16).to(Device::cpu());
  Tensor on_cpu = x.to(DType::BF16);
  EXPECT_EQ(std::memcmp(on_gpu.raw_data(), on_cpu.raw_data(), on_cpu.nbytes()), 0);
  // The conversion kernels give the CPU's bits too (round to nearest even).
  Tensor xb = Tensor::empty({1, 4097}, DType::BF16, kGpu);
  Tensor xg = x.to(kGpu);
  cuda::convert_f32_to_bf16(cuda::context(0), xb.data<bf16>(), xg.data<float>(), x.numel());
  Tensor kernel_bits = xb.to(Device::cpu());
  EXPECT_EQ(std::memcmp(kernel_bits.raw_data(), on_cpu.raw_data(), on_cpu.nbytes()), 0);
}

TEST(CudaElementwise, MatchesTheCpuBitForBit) {
  LOOM_REQUIRE_GPU();
  Tensor a = random_cpu({1000, 33}, 3), b = random_cpu({1000, 33}, 4);
  Tensor ag = a.to(kGpu), bg = b.to(kGpu);
  EXPECT_EQ(host_values(ops::add(ag, bg)), host_values(ops::add(a, b)));
  EXPECT_EQ(host_values(ops::mul(ag, bg)), host_values(ops::mul(a, b)));
  EXPECT_EQ(host_values(ops::scale(ag, -0.37f)), host_values(ops::scale(a, -0.37f)));
  Tensor acc = a.clone(), accg = a.to(kGpu);
  ops::add_(acc, b);
  ops::add_(accg, bg);
  EXPECT_EQ(host_values(accg), host_values(acc));
  // bf16: widened, added in f32, rounded once, as on the CPU.
  Tensor ab = a.to(DType::BF16), bb = b.to(DType::BF16);
  Tensor outg = Tensor::empty(a.shape(), DType::BF16, kGpu);
  Tensor abg = ab.to(kGpu), bbg = bb.to(kGpu);
  cuda::add_forward(cuda::context(0), outg.data<bf16>(), abg.data<bf16>(), bbg.data<bf16>(), a.numel());
  std::vector<float> expect(static_cast<size_t>(a.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) {
    expect[size_t(i)] = bf16::from_float(ab.data<bf16>()[i].to_float() + bb.data<bf16>()[i].to_float()).to_float();
  }
  EXPECT_EQ(host_values(outg), expect);
}

// The bias gradient's column sums in blocks of rows (backends/row_sums.h): the CPU's bits, over one
// block, several and a partial last one, and no row at all.
TEST(CudaElementwise, SumRowsIsTheCpusBitForBit) {
  LOOM_REQUIRE_GPU();
  for (int64_t M : {int64_t{0}, int64_t{5}, kRowSumBlock, 7 * kRowSumBlock + 3}) {
    const int64_t N = 77;
    Tensor x = random_cpu({std::max<int64_t>(M, 1), N}, 8);
    std::vector<float> want(N);
    cpu::sum_rows(x.data<float>(), M, N, want.data());
    Tensor xg = x.to(kGpu), outg = Tensor::empty({N}, DType::F32, kGpu);
    cuda::sum_rows(cuda::context(0), xg.data<float>(), M, N, outg.data<float>());
    EXPECT_EQ(host_values(outg), want) << M;
  }
}

TEST(CudaElementwise, GradientsFlowThroughAddAndMul) {
  LOOM_REQUIRE_GPU();
  Tensor a = test::param(random_cpu({64}, 5).to(kGpu)), b = test::param(random_cpu({64}, 6).to(kGpu));
  Tensor ac = test::param(a.detach().to(Device::cpu())), bc = test::param(b.detach().to(Device::cpu()));
  // No CUDA sum yet: the loss's backward starts from an explicit gradient.
  Tensor y = ops::mul(ops::add(a, b), b), yc = ops::mul(ops::add(ac, bc), bc);
  Tensor g = random_cpu({64}, 7);
  autograd::backward(y, g.to(kGpu));
  autograd::backward(yc, g);
  EXPECT_LT(relative_error(host_values(a.grad()), host_values(ac.grad())), 1e-6);
  EXPECT_LT(relative_error(host_values(b.grad()), host_values(bc.grad())), 1e-6);
}

class CudaRmsNorm : public testing::TestWithParam<DType> {};

TEST_P(CudaRmsNorm, ForwardAndBackwardMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const DType dtype = GetParam();
  for (auto [rows, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {37, 768}, {300, 1000}, {64, 4096}}) {
    Tensor x = random_cpu({rows, C}, 10 + C).to(dtype);
    Tensor w = random_cpu({C}, 11 + C, 0.5f);
    Tensor dy = random_cpu({rows, C}, 12 + C).to(dtype);
    Tensor xc = test::param(x), wc = test::param(w);
    Tensor xg = test::param(x.to(kGpu)), wg = test::param(w.to(kGpu));
    Tensor yc = ops::rms_norm(xc, wc, 1e-5f), yg = ops::rms_norm(xg, wg, 1e-5f);
    EXPECT_LT(relative_error(host_values(yg), host_values(yc)), test::tolerance(dtype)) << rows << "x" << C;
    autograd::backward(yc, dy);
    autograd::backward(yg, dy.to(kGpu));
    EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), test::tolerance(dtype)) << rows << "x" << C;
    EXPECT_LT(relative_error(host_values(wg.grad()), host_values(wc.grad())), test::tolerance(dtype)) << rows << "x" << C;
  }
}

TEST_P(CudaRmsNorm, WeightGradientIsDeterministic) {
  LOOM_REQUIRE_GPU();
  Tensor x = random_cpu({999, 512}, 20).to(GetParam()).to(kGpu);
  Tensor dy = random_cpu({999, 512}, 21).to(GetParam()).to(kGpu);
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < 2; ++i) {
    Tensor w = test::param(random_cpu({512}, 22).to(kGpu));
    autograd::backward(ops::rms_norm(x, w), dy);
    grads.push_back(host_values(w.grad()));
  }
  EXPECT_EQ(grads[0], grads[1]);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaRmsNorm, testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// cuBLASLt against the CPU's double-accumulating reference GEMM, over transposes, padded leading
// dimensions, the bias and GELU epilogues, bf16 inputs and outputs, and a batch.
TEST(CudaGemm, MatchesTheReferenceOverLayoutsEpiloguesAndDtypes) {
  LOOM_REQUIRE_GPU();
  const int64_t M = 67, N = 129, K = 200, pad = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (auto epi : {cuda::GemmEpilogue::None, cuda::GemmEpilogue::Bias, cuda::GemmEpilogue::BiasGelu}) {
        for (DType in : {DType::F32, DType::BF16}) {
          const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
          Tensor A = random_cpu({ta ? K : M, lda}, 30 + ta), B = random_cpu({tb ? N : K, ldb}, 32 + tb);
          Tensor bias = random_cpu({N}, 34);
          Tensor C = random_cpu({M, ldc}, 35);  // beta = 0.5 reads it
          if (in == DType::BF16) {  // the reference sees the same rounded inputs
            A = A.to(DType::BF16).to(DType::F32);
            B = B.to(DType::BF16).to(DType::F32);
          }
          Tensor ref = C.clone();
          cpu::gemm_reference(ta, tb, M, N, K, 1.5f, A.data<float>(), lda, B.data<float>(), ldb, 0.5f,
                              ref.data<float>(), ldc);
          std::vector<float> expect = ref.to_vector<float>();
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              float& v = expect[size_t(m * ldc + n)];
              if (epi != cuda::GemmEpilogue::None) v += bias.data<float>()[n];
              if (epi == cuda::GemmEpilogue::BiasGelu) {
                v = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
              }
            }
          }
          Tensor Ag = A.to(in).to(kGpu), Bg = B.to(in).to(kGpu), Cg = C.to(kGpu), biasg = bias.to(kGpu);
          cuda::GemmProblem p;
          p.trans_a = ta;
          p.trans_b = tb;
          p.M = M, p.N = N, p.K = K, p.alpha = 1.5f, p.beta = 0.5f;
          p.A = Ag.raw_data(), p.lda = lda, p.B = Bg.raw_data(), p.ldb = ldb, p.C = Cg.raw_data(), p.ldc = ldc;
          p.input = in;
          p.output = DType::F32;
          p.bias = epi == cuda::GemmEpilogue::None ? nullptr : biasg.data<float>();
          p.epilogue = epi;
          cuda::gemm(cuda::context(0), p);
          // Padding columns stay as they were (beta only touches [M, N]).
          std::vector<float> got = host_values(Cg);
          std::vector<float> got_mn, expect_mn;
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < ldc; ++n) {
              if (n < N) {
                got_mn.push_back(got[size_t(m * ldc + n)]);
                expect_mn.push_back(expect[size_t(m * ldc + n)]);
              } else {
                ASSERT_EQ(got[size_t(m * ldc + n)], C.data<float>()[m * ldc + n]);
              }
            }
          }
          // GELU in cuBLASLt's epilogue may use a fast tanh: a looser bound there.
          EXPECT_LT(relative_error(got_mn, expect_mn), epi == cuda::GemmEpilogue::BiasGelu ? 1e-3 : 1e-5)
              << "ta=" << ta << " tb=" << tb << " epilogue=" << int(epi) << " in=" << dtype_name(in);
        }
      }
    }
  }
}

TEST(CudaGemm, Bf16OutputAndBatches) {
  LOOM_REQUIRE_GPU();
  const int64_t batch = 3, M = 50, N = 70, K = 90;
  Tensor A = random_cpu({batch, M, K}, 40).to(DType::BF16), B = random_cpu({batch, K, N}, 41).to(DType::BF16);
  Tensor Af = A.to(DType::F32), Bf = B.to(DType::F32);
  std::vector<float> expect(size_t(batch * M * N));
  for (int64_t b = 0; b < batch; ++b) {
    cpu::gemm_reference(false, false, M, N, K, 1.0f, Af.data<float>() + b * M * K, K, Bf.data<float>() + b * K * N, N,
                        0.0f, expect.data() + b * M * N, N);
  }
  Tensor Ag = A.to(kGpu), Bg = B.to(kGpu), Cg = Tensor::empty({batch, M, N}, DType::BF16, kGpu);
  cuda::GemmProblem p;
  p.M = M, p.N = N, p.K = K;
  p.A = Ag.raw_data(), p.lda = K, p.B = Bg.raw_data(), p.ldb = N, p.C = Cg.raw_data(), p.ldc = N;
  p.input = DType::BF16;
  p.output = DType::BF16;
  p.batch = batch, p.stride_a = M * K, p.stride_b = K * N, p.stride_c = M * N;
  cuda::gemm(cuda::context(0), p);
  EXPECT_LT(relative_error(host_values(Cg), expect), test::tolerance(DType::BF16));
}

TEST(CudaGemm, BadProblemsNameTheValue) {
  LOOM_REQUIRE_GPU();
  cuda::GemmProblem p;
  p.M = 4, p.N = 4, p.K = 4, p.lda = 2, p.ldb = 4, p.ldc = 4;
  try {
    cuda::gemm(cuda::context(0), p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=2"), std::string::npos) << e.what();
  }
  p.lda = 4;
  p.output = DType::BF16;  // f32 inputs cannot write bf16
  EXPECT_THROW(cuda::gemm(cuda::context(0), p), Error);
}

TEST(CudaAllocator, SteadyStepsTakeNoNewMemoryAndOomNamesTheDevice) {
  LOOM_REQUIRE_GPU();
  CachingAllocator& alloc = cuda::caching_allocator(0);
  auto step = [] {
    Tensor a = Tensor::empty({1 << 20}, DType::F32, kGpu);
    Tensor b = Tensor::empty({3, 1000}, DType::BF16, kGpu);
    Tensor c = ops::add(a.view({1 << 20}), a);
  };
  step();
  const int64_t raw = alloc.stats().raw_allocations;
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(alloc.stats().raw_allocations, raw);
  const int64_t retries = alloc.stats().oom_retries;
  try {
    Tensor::empty({int64_t(1) << 48}, DType::F32, kGpu);  // 1 PiB
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.stats().oom_retries, retries + 1) << "the cache was not freed before giving up";
}

// A step captured into a CUDA graph and replayed: acc += a * b each step, written in place into a
// tensor made before the step, read after.
TEST(CudaStepCapture, ReplaysTheCapturedStep) {
  LOOM_REQUIRE_GPU();
  Tensor a = random_cpu({4096}, 50), b = random_cpu({4096}, 51);
  Tensor ag = a.to(kGpu), bg = b.to(kGpu), acc = Tensor::zeros({4096}, DType::F32, kGpu);
  auto capture = make_step_capture(kGpu, {.warmup_steps = 2});
  EXPECT_EQ(capture->kind(), "cuda-graph");
  const int steps = 6;
  for (int i = 0; i < steps; ++i) {
    capture->run([&] {
      autograd::NoGradGuard no_grad;
      Tensor t = ops::mul(ag, bg);
      ops::add_(acc, t);
    });
  }
  cuda::synchronize(kGpu, "test");
  const StepCaptureStats s = capture->stats();
  EXPECT_EQ(s.eager_steps, 2);
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, steps - 2);
  std::vector<float> expect(4096);
  for (size_t i = 0; i < expect.size(); ++i) {
    float v = 0;
    for (int k = 0; k < steps; ++k) v += a.data<float>()[i] * b.data<float>()[i];
    expect[i] = v;
  }
  EXPECT_LT(relative_error(host_values(acc), expect), 1e-6);
}

TEST(CudaStepCapture, AStepNeedingNewMemoryDuringCaptureIsAnError) {
  LOOM_REQUIRE_GPU();
  int64_t n = 1000;
  auto capture = make_step_capture(kGpu, {.warmup_steps = 1});
  capture->run([&] { Tensor t = Tensor::empty({n}, DType::F32, kGpu); });
  n = int64_t(1) << 28;  // a size the warm-up never cached
  try {
    capture->run([&] { Tensor t = Tensor::empty({n}, DType::F32, kGpu); });
    FAIL() << "capture took new memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step capture"), std::string::npos) << e.what();
  }
}
