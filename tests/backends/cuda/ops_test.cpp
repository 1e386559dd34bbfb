// The op families' CUDA kernels against the CPU backend on the same random inputs, forward and
// backward, through the ops (so the dispatch on Device::cuda is tested too), with tolerances by dtype.
// Every test skips without a GPU; tools/device_check.sh runs them on a lent one.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cpu/attention.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_chunked.h"
#include "backends/cuda/optimizer.h"
#include "core/autograd.h"
#include "gpu_test.h"
#include "nn/parameter.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/softmax.h"
#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;
using namespace loom::test;

namespace {

Tensor random_ids(const Shape& shape, int32_t V, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(seed), uint64_t(i)) % uint32_t(V));
  }
  return t;
}

// A CPU leaf and its GPU twin, both requiring grad.
std::pair<Tensor, Tensor> leaf_pair(const Tensor& cpu_value) {
  return {test::param(cpu_value), test::param(cpu_value.to(kGpu))};
}

}  // namespace

// ---- linear and matmul (cuBLASLt) ------------------------------------------------------------------

TEST(CudaLinear, LayoutsBiasAndBf16PrecisionForwardAndBackward) {
  LOOM_REQUIRE_GPU();
  const int64_t B = 3, T = 17, in = 96, out = 130;
  for (ops::WeightLayout layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut}) {
    for (bool with_bias : {true, false}) {
      for (ops::MatmulPrecision precision : {ops::MatmulPrecision::F32, ops::MatmulPrecision::BF16}) {
        const bool out_in = layout == ops::WeightLayout::OutIn;
        auto [xc, xg] = leaf_pair(random_cpu({B, T, in}, 150));
        auto [wc, wg] = leaf_pair(random_cpu(out_in ? Shape{out, in} : Shape{in, out}, 151, 0.1f));
        auto [bc, bg] = leaf_pair(random_cpu({out}, 152));
        Tensor yc = ops::linear(xc, wc, with_bias ? bc : Tensor(), layout, precision);
        Tensor yg = ops::linear(xg, wg, with_bias ? bg : Tensor(), layout, precision);
        const bool bf = precision == ops::MatmulPrecision::BF16;
        const double tol = bf ? test::tolerance(DType::BF16) : 1e-5;
        EXPECT_LT(relative_error(host_values(yg), host_values(yc)), tol) << out_in << with_bias << bf;
        Tensor dy = random_cpu(yc.shape(), 153);
        autograd::backward(yc, dy);
        autograd::backward(yg, dy.to(kGpu));
        EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), tol) << out_in << with_bias << bf;
        EXPECT_LT(relative_error(host_values(wg.grad()), host_values(wc.grad())), tol) << out_in << with_bias << bf;
        if (with_bias) {  // the column sums run in the CPU's order: the same bits
          EXPECT_EQ(host_values(bg.grad()), host_values(bc.grad())) << out_in << bf;
        }
      }
    }
  }
}

TEST(CudaMatmul, BatchedTransposedAndSharedOperands) {
  LOOM_REQUIRE_GPU();
  const int64_t batch = 4, M = 33, K = 40, N = 27;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (bool shared_b : {false, true}) {
        auto [ac, ag] = leaf_pair(random_cpu(ta ? Shape{batch, K, M} : Shape{batch, M, K}, 160 + ta));
        const Shape bs = tb ? Shape{N, K} : Shape{K, N};
        auto [bc, bg] = leaf_pair(random_cpu(shared_b ? bs : Shape{batch, bs[0], bs[1]}, 162 + tb));
        Tensor cc = ops::matmul(ac, bc, ta, tb), cg = ops::matmul(ag, bg, ta, tb);
        EXPECT_LT(relative_error(host_values(cg), host_values(cc)), 1e-5) << ta << tb << shared_b;
        Tensor dc = random_cpu(cc.shape(), 164);
        autograd::backward(cc, dc);
        autograd::backward(cg, dc.to(kGpu));
        EXPECT_LT(relative_error(host_values(ag.grad()), host_values(ac.grad())), 1e-5) << ta << tb << shared_b;
        EXPECT_LT(relative_error(host_values(bg.grad()), host_values(bc.grad())), 1e-5) << ta << tb << shared_b;
      }
    }
  }
}

// ---- embedding -------------------------------------------------------------------------------------

TEST(CudaEmbedding, ForwardAndBackwardAreBitwiseTheCpus) {
  LOOM_REQUIRE_GPU();
  const int64_t V = 300, C = 96;
  Tensor ids = random_ids({4, 37}, int32_t(V), 1);
  ids.data<int32_t>()[5] = ids.data<int32_t>()[9] = 7;  // repeated ids: the scatter-add sums them
  auto [tc, tg] = leaf_pair(random_cpu({V, C}, 2));
  Tensor yc = ops::embedding(ids, tc), yg = ops::embedding(ids.to(kGpu), tg);
  EXPECT_EQ(host_values(yg), host_values(yc));
  Tensor dy = random_cpu(yc.shape(), 3);
  autograd::backward(yc, dy);
  autograd::backward(yg, dy.to(kGpu));
  // One thread per column walks the tokens in order, as the CPU does: the same sums, the same bits.
  EXPECT_EQ(host_values(tg.grad()), host_values(tc.grad()));
  // bf16 tables gather bf16 rows unchanged.
  autograd::NoGradGuard no_grad;
  Tensor tb = random_cpu({V, C}, 4).to(DType::BF16);
  Tensor gb = ops::embedding(ids.to(kGpu), tb.to(kGpu)).to(Device::cpu()), cb = ops::embedding(ids, tb);
  EXPECT_EQ(std::memcmp(gb.raw_data(), cb.raw_data(), cb.nbytes()), 0);
}

TEST(CudaEmbedding, ABadIdIsNamedWithItsPosition) {
  LOOM_REQUIRE_GPU();
  Tensor ids = random_ids({2, 8}, 10, 5);
  ids.data<int32_t>()[11] = 10;
  ids.data<int32_t>()[13] = -1;
  const std::string m = error_of([&] { ops::embedding(ids.to(kGpu), random_cpu({10, 4}, 6).to(kGpu)); });
  EXPECT_NE(m.find("id 10 at flat position 11"), std::string::npos) << m;
}

// ---- RoPE ------------------------------------------------------------------------------------------

TEST(CudaRope, BothStylesSharedAndPerRowPositions) {
  LOOM_REQUIRE_GPU();
  for (ops::RopeStyle style : {ops::RopeStyle::Interleaved, ops::RopeStyle::RotateHalf}) {
    for (bool per_row : {false, true}) {
      const int64_t B = 2, H = 3, T = 17, D = 64;
      Tensor pos = per_row ? random_ids({B, H, T}, 4000, 7) : random_ids({T}, 4000, 8);
      auto [xc, xg] = leaf_pair(random_cpu({B, H, T, D}, 9));
      Tensor yc = ops::rope(xc, pos, 10000.0f, style), yg = ops::rope(xg, pos, 10000.0f, style);
      EXPECT_LT(relative_error(host_values(yg), host_values(yc)), 1e-6) << per_row;
      Tensor dy = random_cpu(yc.shape(), 10);
      autograd::backward(yc, dy);
      autograd::backward(yg, dy.to(kGpu));
      EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), 1e-6) << per_row;
    }
  }
}

// ---- softmax ---------------------------------------------------------------------------------------

TEST(CudaSoftmax, LastAndMiddleDimensionsForwardAndBackward) {
  LOOM_REQUIRE_GPU();
  for (int dim : {-1, 1}) {
    Tensor x = random_cpu({6, 129, 5}, 11, 3.0f);
    x.data<float>()[0] = -INFINITY;
    auto [xc, xg] = leaf_pair(x);
    Tensor yc = ops::softmax(xc, dim), yg = ops::softmax(xg, dim);
    EXPECT_LT(relative_error(host_values(yg), host_values(yc)), 1e-5) << dim;
    Tensor dy = random_cpu(x.shape(), 12);
    autograd::backward(yc, dy);
    autograd::backward(yg, dy.to(kGpu));
    EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), 1e-5) << dim;
  }
  // A row of -inf gives zeros, not NaN.
  Tensor all_masked = Tensor::full({2, 40}, -INFINITY, DType::F32, kGpu);
  for (float v : host_values(ops::softmax(all_masked))) EXPECT_EQ(v, 0.0f);
}

// ---- LayerNorm -------------------------------------------------------------------------------------

class CudaLayerNorm : public testing::TestWithParam<DType> {};

TEST_P(CudaLayerNorm, ForwardAndBackwardMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const DType dtype = GetParam();
  for (auto [rows, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {37, 768}, {300, 1000}}) {
    for (bool with_bias : {true, false}) {
      // A large common offset: the corrected two-pass variance must hold on the GPU too.
      Tensor x = ops::add(random_cpu({rows, C}, 20 + C), Tensor::full({rows, C}, 1e3f)).to(dtype);
      auto [xc, xg] = leaf_pair(x);
      auto [wc, wg] = leaf_pair(random_cpu({C}, 21, 0.5f));
      auto [bc, bg] = leaf_pair(random_cpu({C}, 22));
      Tensor yc = ops::layer_norm(xc, wc, with_bias ? bc : Tensor()), yg = ops::layer_norm(xg, wg, with_bias ? bg : Tensor());
      const double tol = test::tolerance(dtype);
      EXPECT_LT(relative_error(host_values(yg), host_values(yc)), tol) << rows << "x" << C;
      Tensor dy = random_cpu({rows, C}, 23).to(dtype);
      autograd::backward(yc, dy);
      autograd::backward(yg, dy.to(kGpu));
      EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), tol) << rows << "x" << C;
      EXPECT_LT(relative_error(host_values(wg.grad()), host_values(wc.grad())), tol) << rows << "x" << C;
      if (with_bias) {
        EXPECT_LT(relative_error(host_values(bg.grad()), host_values(bc.grad())), tol) << rows << "x" << C;
      }
    }
  }
}

TEST_P(CudaLayerNorm, RowsWhoseSquaresOverflowStayFinite) {
  LOOM_REQUIRE_GPU();
  Tensor x = ops::scale(random_cpu({4, 256}, 24), 1e20f).to(GetParam());
  Tensor w = Tensor::full({256}, 1.0f), b = Tensor::zeros({256});
  Tensor yc = ops::layer_norm(x, w, b), yg = ops::layer_norm(x.to(kGpu), w.to(kGpu), b.to(kGpu));
  EXPECT_LT(relative_error(host_values(yg), host_values(yc)), test::tolerance(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLayerNorm, testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The fused residual + RMSNorm: both outputs and the shared gradient of x and residual.
TEST_P(CudaLayerNorm, AddRmsNormMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  const DType dtype = GetParam();
  const int64_t rows = 70, C = 384;
  auto [xc, xg] = leaf_pair(random_cpu({rows, C}, 25).to(dtype));
  auto [rc, rg] = leaf_pair(random_cpu({rows, C}, 26).to(dtype));
  auto [wc, wg] = leaf_pair(random_cpu({C}, 27, 0.5f));
  ops::AddRmsNorm oc = ops::add_rms_norm(xc, rc, wc), og = ops::add_rms_norm(xg, rg, wg);
  const double tol = test::tolerance(dtype);
  EXPECT_LT(relative_error(host_values(og.sum), host_values(oc.sum)), tol);
  EXPECT_LT(relative_error(host_values(og.normed), host_values(oc.normed)), tol);
  // One root reading both outputs (swiglu takes bf16 too), so the backward adds the residual stream's
  // gradient to the norm's.
  Tensor dy = random_cpu({rows, C}, 28).to(dtype);
  autograd::backward(ops::swiglu(oc.sum, oc.normed), dy);
  autograd::backward(ops::swiglu(og.sum, og.normed), dy.to(kGpu));
  EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), tol);
  EXPECT_LT(relative_error(host_values(rg.grad()), host_values(rc.grad())), tol);
  EXPECT_LT(relative_error(host_values(wg.grad()), host_values(wc.grad())), tol);
}

// ---- losses ----------------------------------------------------------------------------------------

TEST(CudaCrossEntropy, LossAndGradientWithIgnoredTargets) {
  LOOM_REQUIRE_GPU();
  const int64_t N = 70, V = 1003;
  Tensor targets = random_ids({N}, int32_t(V), 30);
  targets.data<int32_t>()[3] = targets.data<int32_t>()[40] = -100;
  auto [lc, lg] = leaf_pair(random_cpu({N, V}, 31, 2.0f));
  Tensor loss_c = ops::cross_entropy(lc, targets), loss_g = ops::cross_entropy(lg, targets.to(kGpu));
  EXPECT_NEAR(host_values(loss_g)[0], host_values(loss_c)[0], 1e-5 * std::abs(host_values(loss_c)[0]));
  // An upstream gradient other than 1 is read on the device.
  autograd::backward(loss_c, Tensor::full({}, 0.5f));
  autograd::backward(loss_g, Tensor::full({}, 0.5f, DType::F32, kGpu));
  EXPECT_LT(relative_error(host_values(lg.grad()), host_values(lc.grad())), 1e-5);
}

TEST(CudaLinearCrossEntropy, ChunkedF32AndBf16MatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const int64_t B = 3, T = 50, C = 64, V = 777;
  Tensor targets = random_ids({B, T}, int32_t(V), 40);
  targets.data<int32_t>()[7] = -100;
  for (ops::MatmulPrecision precision : {ops::MatmulPrecision::F32, ops::MatmulPrecision::BF16}) {
    for (int64_t chunk : {int64_t(64), int64_t(512)}) {
      auto [xc, xg] = leaf_pair(random_cpu({B, T, C}, 41));
      auto [wc, wg] = leaf_pair(random_cpu({V, C}, 42, 0.1f));
      Tensor lc = ops::linear_cross_entropy(xc, wc, targets, -100, precision, chunk);
      Tensor lg = ops::linear_cross_entropy(xg, wg, targets.to(kGpu), -100, precision, chunk);
      const bool bf = precision == ops::MatmulPrecision::BF16;
      const double tol = bf ? test::tolerance(DType::BF16) : 1e-5;
      EXPECT_NEAR(host_values(lg)[0], host_values(lc)[0], tol * std::abs(host_values(lc)[0])) << bf << chunk;
      autograd::backward(lc);
      autograd::backward(lg);
      EXPECT_LT(relative_error(host_values(xg.grad()), host_values(xc.grad())), tol) << bf << chunk;
      EXPECT_LT(relative_error(host_values(wg.grad()), host_values(wc.grad())), tol) << bf << chunk;
    }
  }
}

TEST(CudaCrossEntropy, ABadTargetIsNamed) {
  LOOM_REQUIRE_GPU();
  Tensor targets = random_ids({8}, 5, 43);
  targets.data<int32_t>()[6] = 5;
  const std::string m = error_of([&] { ops::cross_entropy(random_cpu({8, 5}, 44).to(kGpu), targets.to(kGpu)); });
  EXPECT_NE(m.find("target 5 at flat position 6"), std::string::npos) << m;
}

// ---- AdamW -----------------------------------------------------------------------------------------

TEST(CudaAdamW, StepsAndClippingMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::vector<nn::Parameter> pc(2), pg(2);
  for (int i = 0; i < 2; ++i) {
    const Tensor init = random_cpu({1000 + 37 * i}, 50 + i);
    pc[i].name = pg[i].name = std::string(i == 0 ? "p0" : "p1");
    pc[i].value = init.clone();
    pg[i].value = init.to(kGpu);
  }
  train::AdamW oc({&pc[0], &pc[1]}, {}), og({&pg[0], &pg[1]}, {});
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> gc, gg;
    for (int i = 0; i < 2; ++i) {
      const Tensor g = random_cpu(pc[i].value.shape(), 60 + 10 * step + i, 3.0f);
      pc[i].value.set_grad(g.clone());
      pg[i].value.set_grad(g.to(kGpu));
      gc.push_back(pc[i].value.grad());
      gg.push_back(pg[i].value.grad());
    }
    const double nc = train::clip_grad_norm(gc, 1.0), ng = train::clip_grad_norm(gg, 1.0);
    EXPECT_NEAR(ng, nc, 1e-12 * nc);
    oc.step(1e-2f);
    og.step(1e-2f);
  }
  for (int i = 0; i < 2; ++i) EXPECT_LT(relative_error(host_values(pg[i].value), host_values(pc[i].value)), 1e-6);
}

TEST(CudaAdamW, TheBf16CopyIsTheRoundedMaster) {
  LOOM_REQUIRE_GPU();
  const int64_t n = 5000;
  Tensor p = random_cpu({n}, 70).to(kGpu), g = random_cpu({n}, 71).to(kGpu);
  Tensor m = Tensor::zeros({n}, DType::F32, kGpu), v = Tensor::zeros({n}, DType::F32, kGpu);
  Tensor copy = Tensor::empty({n}, DType::BF16, kGpu);
  cuda::adamw_update(cuda::context(0), p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), n, 1e-3f,
                     0.9f, 0.999f, 1e-8f, 0.1f, 0.1, 0.001, copy.data<bf16>());
  Tensor expect = p.to(Device::cpu()).to(DType::BF16), got = copy.to(Device::cpu());
  EXPECT_EQ(std::memcmp(got.raw_data(), expect.raw_data(), expect.nbytes()), 0);
}

// ---- activations -----------------------------------------------------------------------------------

class CudaActivations : public testing::TestWithParam<DType> {};

TEST_P(CudaActivations, SiluGeluSwigluForwardAndBackwardMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const DType dtype = GetParam();
  const double tol = dtype == DType::BF16 ? test::tolerance(DType::BF16) : 1e-5;
  // Large |x| too: the tanh GELU's clamped gradient, saturated sigmoids.
  Tensor x = ops::scale(random_cpu({3, 1001}, 140), 4.0f);
  x.data<float>()[0] = 30.0f;
  x.data<float>()[1] = -30.0f;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> fns{
      {"silu", [](const Tensor& a, const Tensor&) { return ops::silu(a); }},
      {"gelu", [](const Tensor& a, const Tensor&) { return ops::gelu(a); }},
      {"gelu tanh", [](const Tensor& a, const Tensor&) { return ops::gelu(a, ops::GeluApproximation::Tanh); }},
      {"swiglu", [](const Tensor& a, const Tensor& b) { return ops::swiglu(a, b); }}};
  for (const auto& [name, f] : fns) {
    auto [ac, ag] = leaf_pair(x.to(dtype));
    auto [bc, bg] = leaf_pair(random_cpu({3, 1001}, 141).to(dtype));
    Tensor yc = f(ac, bc), yg = f(ag, bg);
    EXPECT_LT(relative_error(host_values(yg), host_values(yc)), tol) << name;
    Tensor dy = random_cpu({3, 1001}, 142).to(dtype);
    autograd::backward(yc, dy);
    autograd::backward(yg, dy.to(kGpu));
    EXPECT_LT(relative_error(host_values(ag.grad()), host_values(ac.grad())), tol) << name;
    if (name == "swiglu") {
      EXPECT_LT(relative_error(host_values(bg.grad()), host_values(bc.grad())), tol) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaActivations, testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- dropout ---------------------------------------------------------------------------------------

TEST(CudaDropout, TheMaskAndValuesAreBitwiseTheCpus) {
  LOOM_REQUIRE_GPU();
  const RngKey key = RngKey::from_seed(80).fold_in("dropout");
  for (DType dtype : {DType::F32, DType::BF16}) {
    // 10007: not a multiple of the CPU's 64-element Philox tiles, so its scalar tail is compared too.
    auto [xc, xg] = leaf_pair(random_cpu({10007}, 81).to(dtype));
    Tensor yc = ops::dropout(xc, 0.3f, key), yg = ops::dropout(xg, 0.3f, key);
    Tensor hc = yc.detach(), hg = yg.detach().to(Device::cpu());
    EXPECT_EQ(std::memcmp(hg.raw_data(), hc.raw_data(), hc.nbytes()), 0) << dtype_name(dtype);
    Tensor dy = random_cpu({10007}, 82).to(dtype);
    autograd::backward(yc, dy);
    autograd::backward(yg, dy.to(kGpu));
    Tensor gc = xc.grad(), gg = xg.grad().to(Device::cpu());
    EXPECT_EQ(std::memcmp(gg.raw_data(), gc.raw_data(), gc.nbytes()), 0) << dtype_name(dtype);
  }
}

// ---- attention -------------------------------------------------------------------------------------

struct AttentionCase {
  int64_t B, T, H, Hkv, D;
  bool rope;
  float dropout;
};

class CudaCausalSelfAttention : public testing::TestWithParam<AttentionCase> {};

TEST_P(CudaCausalSelfAttention, ForwardAndBackwardMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const AttentionCase c = GetParam();
  auto [qc, qg] = leaf_pair(random_cpu({c.B, c.T, c.H * c.D}, 90));
  auto [kc, kg] = leaf_pair(random_cpu({c.B, c.T, c.Hkv * c.D}, 91));
  auto [vc, vg] = leaf_pair(random_cpu({c.B, c.T, c.Hkv * c.D}, 92));
  std::optional<ops::RopeOptions> rope;
  if (c.rope) rope = ops::RopeOptions{random_ids({c.B, c.T}, 2048, 93), 10000.0f, ops::RopeStyle::RotateHalf, {}};
  const ops::AttentionDropout dropout{c.dropout, RngKey::from_seed(94)};
  Tensor oc = ops::causal_self_attention(qc, kc, vc, int(c.H), rope, int(c.Hkv), dropout);
  Tensor og = ops::causal_self_attention(qg, kg, vg, int(c.H), rope, int(c.Hkv), dropout);
  EXPECT_LT(relative_error(host_values(og), host_values(oc)), 1e-5);
  Tensor dout = random_cpu(oc.shape(), 95);
  autograd::backward(oc, dout);
  autograd::backward(og, dout.to(kGpu));
  // With one key (T = 1) dq and dk are exactly 0, and each backend returns its own rounding noise:
  // they are measured against dv's size then.
  const double scale = 1e-2 * norm_of(host_values(vc.grad()));
  EXPECT_LT(relative_error_floored(host_values(qg.grad()), host_values(qc.grad()), scale), 1e-4);
  EXPECT_LT(relative_error_floored(host_values(kg.grad()), host_values(kc.grad()), scale), 1e-4);
  EXPECT_LT(relative_error(host_values(vg.grad()), host_values(vc.grad())), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCausalSelfAttention,
                         testing::Values(AttentionCase{2, 70, 4, 4, 64, false, 0.0f},   // GPT-2-like
                                         AttentionCase{1, 129, 8, 2, 32, true, 0.0f},   // GQA + RoPE (Llama)
                                         AttentionCase{2, 33, 2, 1, 128, true, 0.0f},   // D = 128, MQA
                                         AttentionCase{2, 45, 3, 3, 16, false, 0.2f},   // dropout
                                         AttentionCase{1, 1, 2, 2, 8, false, 0.0f},     // one token
                                         // several blocks of query rows (256 each), GQA, dropout
                                         AttentionCase{2, 600, 4, 2, 32, true, 0.1f}));

// Mixed precision (bf16 products): q, k, v, dO, P and dS rounded to bf16 for the tensor cores, scores
// and sums f32. Against the f32 CPU op, the error is bf16's (2^-9 relative per operand), not a bug's.
TEST(CudaCausalSelfAttention, Bf16ProductsStayWithinBf16RoundingOfF32) {
  LOOM_REQUIRE_GPU();
  const int64_t B = 2, T = 300, H = 4, Hkv = 2, D = 64;
  auto [qc, qg] = leaf_pair(random_cpu({B, T, H * D}, 96));
  auto [kc, kg] = leaf_pair(random_cpu({B, T, Hkv * D}, 97));
  auto [vc, vg] = leaf_pair(random_cpu({B, T, Hkv * D}, 98));
  Tensor oc = ops::causal_self_attention(qc, kc, vc, int(H), std::nullopt, int(Hkv));
  Tensor og = ops::causal_self_attention(qg, kg, vg, int(H), std::nullopt, int(Hkv), {}, ops::MatmulPrecision::BF16);
  const double out_error = relative_error(host_values(og), host_values(oc));
  EXPECT_LT(out_error, 1e-2);
  // The warp kernels (LOOM_CUDA_ATTENTION=warp) compute in f32 whatever the flag says.
  if (cuda::chunked_attention_enabled()) {
    EXPECT_GT(out_error, 1e-6) << "bf16 products should differ from f32 by their rounding";
  }
  Tensor dout = random_cpu(oc.shape(), 99);
  autograd::backward(oc, dout);
  autograd::backward(og, dout.to(kGpu));
  EXPECT_LT(relative_error(host_values(qg.grad()), host_values(qc.grad())), 2e-2);
  EXPECT_LT(relative_error(host_values(kg.grad()), host_values(kc.grad())), 2e-2);
  EXPECT_LT(relative_error(host_values(vg.grad()), host_values(vc.grad())), 2e-2);
}

TEST(CudaScaledDotProductAttention, CausalAndFullWithTqNotTk) {
  LOOM_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    auto [qc, qg] = leaf_pair(random_cpu({2, 3, 20, 48}, 100));
    auto [kc, kg] = leaf_pair(random_cpu({2, 3, 57, 48}, 101));
    auto [vc, vg] = leaf_pair(random_cpu({2, 3, 57, 40}, 102));  // Dv != D
    Tensor oc = ops::scaled_dot_product_attention(qc, kc, vc, Tensor(), causal);
    Tensor og = ops::scaled_dot_product_attention(qg, kg, vg, Tensor(), causal);
    EXPECT_LT(relative_error(host_values(og), host_values(oc)), 1e-5) << causal;
    Tensor dout = random_cpu(oc.shape(), 103);
    autograd::backward(oc, dout);
    autograd::backward(og, dout.to(kGpu));
    EXPECT_LT(relative_error(host_values(qg.grad()), host_values(qc.grad())), 1e-4) << causal;
    EXPECT_LT(relative_error(host_values(kg.grad()), host_values(kc.grad())), 1e-4) << causal;
    EXPECT_LT(relative_error(host_values(vg.grad()), host_values(vc.grad())), 1e-4) << causal;
  }
}

// bf16 operands through the kernels directly (the ops take f32 so far): against the CPU kernels on the
// same bf16-rounded inputs, bf16 tolerance.
TEST(CudaFlashAttention, Bf16OperandsMatchTheCpuOnRoundedInputs) {
  LOOM_REQUIRE_GPU();
  const int64_t N = 4, T = 96, D = 64;
  AttentionProblem p;
  p.batches = N;
  p.tq = p.tk = T;
  p.d = p.dv = D;
  p.scale = 0.125f;
  p.causal = true;
  p.q = p.k = p.v = p.out = {T * D, 0, D};
  Tensor q = random_cpu({N, T, D}, 110).to(DType::BF16), k = random_cpu({N, T, D}, 111).to(DType::BF16);
  Tensor v = random_cpu({N, T, D}, 112).to(DType::BF16), dout = random_cpu({N, T, D}, 113).to(DType::BF16);
  Tensor qf = q.to(DType::F32), kf = k.to(DType::F32), vf = v.to(DType::F32), df = dout.to(DType::F32);
  Tensor out = Tensor::empty({N, T, D}), lse = Tensor::empty({N, T});
  Tensor dq = Tensor::empty({N, T, D}), dk = Tensor::empty({N, T, D}), dv = Tensor::empty({N, T, D});
  cpu::flash_attention_forward(p, qf.data<float>(), kf.data<float>(), vf.data<float>(), out.data<float>(),
                               lse.data<float>());
  cpu::flash_attention_backward(p, qf.data<float>(), kf.data<float>(), vf.data<float>(), out.data<float>(),
                                df.data<float>(), lse.data<float>(), dq.data<float>(), dk.data<float>(),
                                dv.data<float>());
  Tensor qg = q.to(kGpu), kg = k.to(kGpu), vg = v.to(kGpu), dg = dout.to(kGpu);
  Tensor og = Tensor::empty({N, T, D}, DType::BF16, kGpu), lg = Tensor::empty({N, T}, DType::F32, kGpu);
  Tensor dqg = Tensor::empty({N, T, D}, DType::BF16, kGpu), dkg = Tensor::empty({N, T, D}, DType::BF16, kGpu);
  Tensor dvg = Tensor::empty({N, T, D}, DType::BF16, kGpu);
  const cuda::Context& cu = cuda::context(0);
  cuda::flash_attention_forward(cu, p, qg.data<bf16>(), kg.data<bf16>(), vg.data<bf16>(), og.data<bf16>(),
                                lg.data<float>());
  cuda::flash_attention_backward(cu, p, qg.data<bf16>(), kg.data<bf16>(), vg.data<bf16>(), og.data<bf16>(),
                                 dg.data<bf16>(), lg.data<float>(), dqg.data<bf16>(), dkg.data<bf16>(), dvg.data<bf16>());
  const double tol = test::tolerance(DType::BF16);
  EXPECT_LT(relative_error(host_values(og), host_values(out)), tol);
  EXPECT_LT(relative_error(host_values(dqg), host_values(dq)), tol);
  EXPECT_LT(relative_error(host_values(dkg), host_values(dk)), tol);
  EXPECT_LT(relative_error(host_values(dvg), host_values(dv)), tol);
}

TEST(CudaFlashAttention, ResultsRepeatBitForBit) {
  LOOM_REQUIRE_GPU();
  Tensor q = random_cpu({2, 100, 256}, 120).to(kGpu), k = random_cpu({2, 100, 128}, 121).to(kGpu);
  Tensor v = random_cpu({2, 100, 128}, 122).to(kGpu), dout = random_cpu({2, 100, 256}, 123).to(kGpu);
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < 2; ++i) {
    Tensor qp = test::param(q), kp = test::param(k), vp = test::param(v);
    autograd::backward(ops::causal_self_attention(qp, kp, vp, 4, std::nullopt, 2), dout);
    grads.push_back(host_values(kp.grad()));
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// ---- MoE routed experts ------------------------------------------------------------------------------

TEST(CudaMoeExperts, ForwardAndBackwardMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const int64_t N = 150, C = 48, F = 40, E = 6, K = 2;
  // Routing over experts 0..4 only: expert 5 gets no token (zero weight gradients), and the runs differ
  // in length.
  Tensor index = Tensor::empty({N, K}, DType::I32);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t a = int32_t(random_bits(RngKey::from_seed(130), uint64_t(n)) % 5);
    index.data<int32_t>()[n * K] = a;
    index.data<int32_t>()[n * K + 1] = (a + 1 + int32_t(n % 3)) % 5;
  }
  for (ops::MatmulPrecision precision : {ops::MatmulPrecision::F32, ops::MatmulPrecision::BF16}) {
    auto [xc, xg] = leaf_pair(random_cpu({N, C}, 131));
    auto [gc, gg] = leaf_pair(ops::scale(random_cpu({N, K}, 132), 0.5f));
    auto [w1c, w1g] = leaf_pair(random_cpu({E, F, C}, 133, 0.2f));
    auto [w3c, w3g] = leaf_pair(random_cpu({E, F, C}, 134, 0.2f));
    auto [w2c, w2g] = leaf_pair(random_cpu({E, C, F}, 135, 0.2f));
    Tensor yc = ops::moe_experts(xc, index, gc, w1c, w3c, w2c, precision);
    Tensor yg = ops::moe_experts(xg, index.to(kGpu), gg, w1g, w3g, w2g, precision);
    const bool bf = precision == ops::MatmulPrecision::BF16;
    const double tol = bf ? test::tolerance(DType::BF16) : 1e-5;
    EXPECT_LT(relative_error(host_values(yg), host_values(yc)), tol) << bf;
    Tensor dy = random_cpu({N, C}, 136);
    autograd::backward(yc, dy);
    autograd::backward(yg, dy.to(kGpu));
    for (auto [g, c] : std::vector<std::pair<Tensor, Tensor>>{{xg, xc}, {gg, gc}, {w1g, w1c}, {w3g, w3c}, {w2g, w2c}}) {
      EXPECT_LT(relative_error(host_values(g.grad()), host_values(c.grad())), tol) << bf;
    }
    const std::vector<float> dw2 = host_values(w2g.grad());
    for (int64_t i = 5 * C * F; i < E * C * F; ++i) ASSERT_EQ(dw2[size_t(i)], 0.0f) << "unchosen expert 5";
  }
}
