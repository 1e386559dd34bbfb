// The DeepSeek-V3 path's CUDA kernels (shape copies, MLA head layouts, MoE routing, the balance loss, the
// bias update) against the CPU ops on the same random inputs, forward and backward, through the ops.
// Every test skips without a GPU; tools/device_check.sh runs them on a lent one.
//
// Tolerances: copies are compared bit for bit; the rotations and the f32/double sums run in the CPU's
// order but the host build may contract products into FMAs (-march=native) and the device's expf may
// differ from the host's exp by an ulp, so those compare to 1e-6 relative; the expert choices and loads
// (integers) are compared exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/autograd.h"
#include "gpu_test.h"
#include "ops/mla.h"
#include "ops/moe.h"
#include "ops/rope.h"
#include "ops/shape.h"
#include "support/op_test.h"

using namespace loom;
using namespace loom::test;

namespace {

constexpr double kRotTol = 1e-6;

std::pair<Tensor, Tensor> leaf_pair(const Tensor& cpu_value) {
  return {test::param(cpu_value), test::param(cpu_value.to(kGpu))};
}

void expect_bitwise_host(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  Tensor h = gpu.to(Device::cpu());
  ASSERT_EQ(h.shape(), cpu.shape()) << what;
  ASSERT_EQ(h.dtype(), cpu.dtype()) << what;
  EXPECT_TRUE(test::bitwise_equal(h, cpu)) << what;
}

Tensor positions_of(int64_t B, int64_t T, bool per_batch, uint64_t seed) {
  if (!per_batch) {
    Tensor p = Tensor::empty({T}, DType::I32);
    for (int64_t t = 0; t < T; ++t) p.data<int32_t>()[t] = static_cast<int32_t>(t);
    return p;
  }
  // Packed rows: positions restarting inside each row.
  Tensor p = Tensor::empty({B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t cut = 1 + int64_t(random_bits(RngKey::from_seed(seed), uint64_t(b)) % uint64_t(T - 1));
    for (int64_t t = 0; t < T; ++t) p.data<int32_t>()[b * T + t] = static_cast<int32_t>(t < cut ? t : t - cut);
  }
  return p;
}

}  // namespace

// ---- shape copies ----------------------------------------------------------------------------------

TEST(CudaShapeOps, NarrowConcatTransposeMatchTheCpuBitForBit) {
  LOOM_REQUIRE_GPU();
  // f32 with gradients through all three.
  auto [ac, ag] = leaf_pair(random_cpu({3, 5, 7, 4}, 500));
  auto [bc, bg] = leaf_pair(random_cpu({3, 5, 2, 4}, 501));
  for (int dim : {0, 1, 2, 3, -1}) {
    const int64_t size = ac.size(dim < 0 ? dim + 4 : dim);
    Tensor nc = ops::narrow(ac, dim, 1, size - 2), ng = ops::narrow(ag, dim, 1, size - 2);
    expect_bitwise_host(ng, nc, "narrow dim " + std::to_string(dim));
  }
  for (auto [d0, d1] : std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 1}, {0, 3}, {1, 3}, {2, 2}}) {
    expect_bitwise_host(ops::transpose(ag, d0, d1), ops::transpose(ac, d0, d1),
                        "transpose " + std::to_string(d0) + "," + std::to_string(d1));
  }
  // A composition: narrow, concat and transpose, backward with a random upstream gradient.
  auto f = [](const Tensor& a, const Tensor& b) {
    Tensor n = ops::narrow(a, 2, 2, 4);                         // [3, 5, 4, 4]
    Tensor c = ops::concat({n, b, ops::narrow(a, 2, 0, 1)}, 2);  // [3, 5, 7, 4]
    return ops::transpose(c, 1, 2);                              // [3, 7, 5, 4]
  };
  Tensor yc = f(ac, bc), yg = f(ag, bg);
  expect_bitwise_host(yg, yc, "composition");
  Tensor dy = random_cpu(yc.shape(), 502);
  autograd::backward(yc, dy);
  autograd::backward(yg, dy.to(kGpu));
  expect_bitwise_host(ag.grad(), ac.grad(), "d a");
  expect_bitwise_host(bg.grad(), bc.grad(), "d b");
  // i32 (the MTP module narrows ids and targets) and bf16 forward.
  Tensor ids = Tensor::empty({2, 9}, DType::I32);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i * 7 - 20);
  expect_bitwise_host(ops::narrow(ids.to(kGpu), 1, 2, 6), ops::narrow(ids, 1, 2, 6), "narrow i32");
  expect_bitwise_host(ops::transpose(ids.to(kGpu), 0, 1), ops::transpose(ids, 0, 1), "transpose i32");
  Tensor h = random_cpu({4, 6}, 503).to(DType::BF16);
  expect_bitwise_host(ops::concat({h.to(kGpu), h.to(kGpu)}, 1), ops::concat({h, h}, 1), "concat bf16");
}

// ---- MLA head layouts ------------------------------------------------------------------------------

TEST(CudaMla, QueryAndKeyValueHeadsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const int64_t B = 2, T = 11, H = 3, N = 8, P = 6, Dv = 10;
  const ops::RopeCache cache = ops::make_rope_cache(32, P, 10000.0f);
  for (bool per_batch : {false, true}) {
    for (bool positions_on_gpu : {false, true}) {
      const std::string what = std::string(per_batch ? "per-row" : "shared") + " positions" +
                               (positions_on_gpu ? " on the GPU" : " on the CPU");
      const Tensor pos = positions_of(B, T, per_batch, 510);
      const Tensor pos_g = positions_on_gpu ? pos.to(kGpu) : pos;
      auto [qc, qg] = leaf_pair(random_cpu({B, T, H * (N + P)}, 511));
      auto [kvc, kvg] = leaf_pair(random_cpu({B, T, H * (N + Dv)}, 512));
      auto [krc, krg] = leaf_pair(random_cpu({B, T, P}, 513));
      Tensor hc = ops::mla_query_heads(qc, H, N, P, pos, cache), hg = ops::mla_query_heads(qg, H, N, P, pos_g, cache);
      auto [kc, vc] = ops::mla_key_value_heads(kvc, krc, H, N, Dv, pos, cache);
      auto [kg, vg] = ops::mla_key_value_heads(kvg, krg, H, N, Dv, pos_g, cache);
      ASSERT_EQ(hg.shape(), Shape({B, H, T, N + P})) << what;
      ASSERT_EQ(kg.shape(), Shape({B, H, T, N + P})) << what;
      ASSERT_EQ(vg.shape(), Shape({B, H, T, Dv})) << what;
      EXPECT_LT(relative_error(host_values(hg), host_values(hc)), kRotTol) << what;
      EXPECT_LT(relative_error(host_values(kg), host_values(kc)), kRotTol) << what;
      expect_bitwise_host(vg, vc, "v, " + what);  // a pure copy
      // The k_nope part of k is a copy too.
      expect_bitwise_host(ops::narrow(kg, -1, 0, N), ops::narrow(kc, -1, 0, N), "k_nope, " + what);
      const Tensor dh = random_cpu(hc.shape(), 514), dk = random_cpu(kc.shape(), 515), dv = random_cpu(vc.shape(), 516);
      autograd::backward(TensorList{hc, kc, vc}, TensorList{dh, dk, dv});
      autograd::backward(TensorList{hg, kg, vg}, TensorList{dh.to(kGpu), dk.to(kGpu), dv.to(kGpu)});
      EXPECT_LT(relative_error(host_values(qg.grad()), host_values(qc.grad())), kRotTol) << what;
      expect_bitwise_host(kvg.grad(), kvc.grad(), "d kv_b, " + what);  // copies only
      EXPECT_LT(relative_error(host_values(krg.grad()), host_values(krc.grad())), kRotTol) << what;
    }
  }
}

// ---- MoE routing -----------------------------------------------------------------------------------

TEST(CudaMoeRoute, ChoicesGatesAffinitiesAndGradientsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const int64_t N = 300, E = 16, K = 4;
  const float route_scale = 2.5f;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::string what = dtype == DType::F32 ? "f32 logits" : "bf16 logits";
    Tensor logits = random_cpu({N, E}, 520);
    if (dtype == DType::BF16) logits = logits.to(DType::BF16);
    auto [lc, lg] = leaf_pair(logits);
    const Tensor bias = random_cpu({E}, 521, 0.3f);
    ops::MoeRouting rc = ops::moe_route(lc, bias, K, route_scale);
    ops::MoeRouting rg = ops::moe_route(lg, bias.to(kGpu), K, route_scale);
    expect_bitwise_host(rg.expert_index, rc.expert_index, "expert_index, " + what);
    expect_bitwise_host(rg.expert_load, rc.expert_load, "expert_load, " + what);
    EXPECT_LT(relative_error(host_values(rg.affinity), host_values(rc.affinity)), kRotTol) << what;
    EXPECT_LT(relative_error(host_values(rg.gates), host_values(rc.gates)), kRotTol) << what;
    const Tensor dg = random_cpu({N, K}, 522), da = random_cpu({N, E}, 523);
    autograd::backward(TensorList{rc.gates, rc.affinity}, TensorList{dg, da});
    autograd::backward(TensorList{rg.gates, rg.affinity}, TensorList{dg.to(kGpu), da.to(kGpu)});
    ASSERT_EQ(lg.grad().dtype(), dtype) << what;
    const double tol = dtype == DType::BF16 ? test::tolerance(DType::BF16) : 1e-5;
    EXPECT_LT(relative_error(host_values(lg.grad()), host_values(lc.grad())), tol) << what;
  }
  // Only the gates carry a gradient (the affinity's arrives as zeros), as in a model without the
  // balance loss.
  auto [lc, lg] = leaf_pair(random_cpu({N, E}, 524));
  const Tensor bias = Tensor::zeros({E});
  ops::MoeRouting rc = ops::moe_route(lc, bias, K, 1.0f), rg = ops::moe_route(lg, bias.to(kGpu), K, 1.0f);
  const Tensor dg = random_cpu({N, K}, 525);
  autograd::backward(rc.gates, dg);
  autograd::backward(rg.gates, dg.to(kGpu));
  EXPECT_LT(relative_error(host_values(lg.grad()), host_values(lc.grad())), 1e-5);
  // A bias left on the CPU (a model whose parameters alone were moved, as `loom bench train` does)
  // routes the same way.
  const Tensor logits = random_cpu({N, E}, 527), host_bias = random_cpu({E}, 528, 0.3f);
  ops::MoeRouting on_cpu = ops::moe_route(logits, host_bias, K, 1.0f);
  ops::MoeRouting mixed = ops::moe_route(logits.to(kGpu), host_bias, K, 1.0f);
  expect_bitwise_host(mixed.expert_index, on_cpu.expert_index, "expert_index with a host bias");
}

TEST(CudaMoeRoute, ANonFiniteBiasIsNamedOnTheGpuToo) {
  LOOM_REQUIRE_GPU();
  Tensor bias = Tensor::zeros({4});
  bias.data<float>()[2] = NAN;
  try {
    ops::moe_route(random_cpu({5, 4}, 526).to(kGpu), bias.to(kGpu), 2, 1.0f);
    FAIL() << "a NaN bias was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias[2]"), std::string::npos) << e.what();
  }
}

// ---- sequence balance loss -------------------------------------------------------------------------

TEST(CudaMoeBalanceLoss, LossAndGradientMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const int64_t B = 3, T = 40, E = 8, K = 2;
  const float alpha = 0.37f;
  const ops::MoeRouting r = ops::moe_route(random_cpu({B * T, E}, 530), random_cpu({E}, 531, 0.1f), K, 1.0f);
  for (float upstream : {1.0f, -2.5f}) {
    auto [ac, ag] = leaf_pair(r.affinity.detach());
    ops::MoeRouting rc{r.expert_index, r.gates.detach(), ac, r.expert_load};
    ops::MoeRouting rg{r.expert_index.to(kGpu), r.gates.detach().to(kGpu), ag, r.expert_load.to(kGpu)};
    Tensor lc = ops::moe_sequence_balance_loss(rc, B, T, alpha), lg = ops::moe_sequence_balance_loss(rg, B, T, alpha);
    ASSERT_TRUE(lg.device().is_cuda());
    ASSERT_EQ(lg.numel(), 1);
    const float vc = lc.item(), vg = host_values(lg)[0];
    EXPECT_NEAR(vg, vc, 1e-6 * std::abs(vc)) << upstream;
    const Tensor up = Tensor::full(Shape{}, upstream);
    autograd::backward(lc, up);
    autograd::backward(lg, up.to(kGpu));
    EXPECT_LT(relative_error(host_values(ag.grad()), host_values(ac.grad())), kRotTol) << upstream;
  }
}

// ---- bias update -----------------------------------------------------------------------------------

TEST(CudaMoeUpdateBias, MatchesTheCpuBitForBitAndNamesANegativeLoad) {
  LOOM_REQUIRE_GPU();
  const int64_t E = 7;
  Tensor load = Tensor::from_vector<int32_t>({E}, {3, 0, 5, 4, 4, 9, 3});  // total 28, mean 4: one tie
  Tensor bc = random_cpu({E}, 540, 0.01f), bg = bc.to(kGpu);
  const float tied = bc.data<float>()[3];  // expert 3 sits at the mean: its bias stays
  for (int step = 0; step < 3; ++step) {
    ops::moe_update_bias_(bc, load, 1e-3f);
    ops::moe_update_bias_(bg, load.to(kGpu), 1e-3f);
  }
  expect_bitwise_host(bg, bc, "bias after 3 updates");
  EXPECT_EQ(host_values(bg)[3], tied);
  Tensor bad = Tensor::from_vector<int32_t>({E}, {3, 0, -5, 4, 4, 9, 3});
  try {
    ops::moe_update_bias_(bg, bad.to(kGpu), 1e-3f);
    FAIL() << "a negative load was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_load[2]"), std::string::npos) << e.what();
  }
}

// ---- without a GPU ---------------------------------------------------------------------------------

// On a machine without a usable GPU (CI here) the ops that now dispatch to CUDA refuse a CUDA tensor with
// an error naming the op and the device, before touching its memory. (Skipped where a GPU exists: the
// fake tensors would reach the kernels.)
TEST(CudaDsv3Dispatch, WithoutAGpuEachOpNamesItselfAndTheDevice) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: the GPU tests above cover these ops";
  const ops::RopeCache cache = ops::make_rope_cache(8, 4, 10000.0f);
  Tensor pos = Tensor::from_vector<int32_t>({2}, {0, 1});
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"narrow", [] { ops::narrow(fake_cuda({2, 3}), 1, 0, 2); }},
      {"transpose", [] { ops::transpose(fake_cuda({2, 3}), 0, 1); }},
      {"concat", [] { ops::concat({fake_cuda({2, 3}), fake_cuda({2, 3})}, 1); }},
      {"mla_query_heads", [&] { ops::mla_query_heads(fake_cuda({1, 2, 2 * 6}), 2, 2, 4, pos, cache); }},
      {"mla_key_value_heads",
       [&] { ops::mla_key_value_heads(fake_cuda({1, 2, 2 * 5}), fake_cuda({1, 2, 4}), 2, 2, 3, pos, cache); }},
      {"moe_route", [] { ops::moe_route(fake_cuda({3, 4}), fake_cuda({4}), 2, 1.0f); }},
      {"moe_sequence_balance_loss",
       [] {
         ops::MoeRouting r{fake_cuda({4, 2}, DType::I32), fake_cuda({4, 2}), fake_cuda({4, 3}), fake_cuda({3}, DType::I32)};
         ops::moe_sequence_balance_loss(r, 2, 2, 0.1f);
       }},
      {"moe_update_bias_",
       [] {
         Tensor bias = fake_cuda({3});
         ops::moe_update_bias_(bias, fake_cuda({3}, DType::I32), 1e-3f);
       }},
  };
  for (const auto& [op, run] : cases) {
    try {
      run();
      ADD_FAILURE() << op << " accepted a CUDA tensor without a GPU";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(op + ":", 0), 0u) << op << ": " << m;
      EXPECT_NE(m.find("cuda:0"), std::string::npos) << op << ": " << m;
    }
  }
}
