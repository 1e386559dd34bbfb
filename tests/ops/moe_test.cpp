// Mixture-of-experts ops (ops/moe.h): PyTorch fixtures (tests/ops/fixtures/make_moe_fixtures.py) for
// routing, the routed experts, the balance loss and the whole routed layer, forward and every gradient;
// finite-difference gradchecks; the sparse kernels against the dense reference; tie-breaking; an
// expert without tokens; bitwise thread-count independence; bf16; and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/moe.h"
#include "core/parallel.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "support/op_test.h"

using namespace loom;
using test::expect_bitwise;

namespace {

test::Fixture fixture() { return test::Fixture::load(std::string(LOOM_TEST_DIR) + "/fixtures/moe.json"); }

// sum(a * r): a scalar through which one output's gradient r flows.
Tensor dot(const Tensor& a, const Tensor& r) { return ops::sum(ops::mul(a, r)); }

void expect_equal_ints(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), DType::I32) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_EQ(actual.to_vector<int32_t>(), expected.to_vector<int32_t>()) << what;
}

Tensor ints(const Shape& shape, const std::vector<int32_t>& v) { return Tensor::from_vector<int32_t>(shape, v); }

// Random routing of N tokens onto K distinct experts of E, skipping the experts in `unused`.
Tensor random_index(int64_t N, int64_t K, int64_t E, uint64_t seed, const std::vector<int>& unused = {}) {
  std::vector<int32_t> allowed;
  for (int e = 0; e < E; ++e)
    if (std::find(unused.begin(), unused.end(), e) == unused.end()) allowed.push_back(e);
  Tensor u = test::randn({N, static_cast<int64_t>(allowed.size())}, seed);
  std::vector<int32_t> idx;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> order(allowed.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    const float* row = u.data<float>() + n * static_cast<int64_t>(allowed.size());
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int64_t k = 0; k < K; ++k) idx.push_back(allowed[static_cast<size_t>(order[static_cast<size_t>(k)])]);
  }
  return ints({N, K}, idx);
}

Tensor positive_gates(int64_t N, int64_t K, uint64_t seed) {
  Tensor g = test::randn({N, K}, seed, 0.3f);
  for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = 0.5f + std::abs(g.data<float>()[i]);
  return g;
}

// Logits whose sorted scores are at least ~0.05 apart in every row (no near-ties for finite differences):
// a per-row permutation of evenly spaced values in [-2, 2].
Tensor separated_logits(int64_t N, int64_t E, uint64_t seed) {
  Tensor u = test::randn({N, E}, seed);
  std::vector<float> v(static_cast<size_t>(N * E));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
    const float* row = u.data<float>() + n * E;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] < row[b]; });
    for (int64_t r = 0; r < E; ++r)
      v[static_cast<size_t>(n * E + order[static_cast<size_t>(r)])] =
          -2.0f + 4.0f * static_cast<float>(r) / static_cast<float>(E - 1);
  }
  return Tensor::from_vector<float>({N, E}, v);
}

struct ExpertInputs {
  Tensor x, index, gates, w1, w3, w2;
};

ExpertInputs expert_inputs(int64_t N, int64_t C, int64_t F, int64_t E, int64_t K, uint64_t seed,
                           const std::vector<int>& unused = {}) {
  return {test::randn({N, C}, seed),
          random_index(N, K, E, seed + 1, unused),
          positive_gates(N, K, seed + 2),
          test::randn({E, F, C}, seed + 3, 0.3f),
          test::randn({E, F, C}, seed + 4, 0.3f),
          test::randn({E, C, F}, seed + 5, 0.3f)};
}

}  // namespace

// ---- routing -------------------------------------------------------------------------------------

TEST(MoeRoute, MatchesPyTorch) {
  const auto fx = fixture();
  Tensor logits = test::param(fx.get("route.logits"));
  const auto top_k = static_cast<int64_t>(fx.get("route.top_k").item());
  ops::MoeRouting r = ops::moe_route(logits, fx.get("route.bias"), top_k, fx.get("route.route_scale").item());
  expect_equal_ints(r.expert_index, fx.get("route.index"), "index");
  expect_equal_ints(r.expert_load, fx.get("route.load"), "load");
  test::expect_close(r.gates, fx.get("route.gates"), 1e-6f, 1e-5f, "gates");
  test::expect_close(r.affinity, fx.get("route.affinity"), 1e-6f, 1e-5f, "affinity");
  autograd::backward(ops::add(dot(r.gates, fx.get("route.dgates")), dot(r.affinity, fx.get("route.daffinity"))));
  test::expect_close(logits.grad(), fx.get("route.dlogits"), 1e-6f, 1e-5f, "dlogits");
}

TEST(MoeRoute, FiniteDifferences) {
  const int64_t N = 6, E = 8, K = 3;
  Tensor logits = test::param(separated_logits(N, E, 11));
  Tensor bias = test::randn({E}, 12, 0.01f);  // small: keeps the selection margins of the logits
  Tensor rg = test::randn({N, K}, 13), ra = test::randn({N, E}, 14);
  test::gradcheck(
      [&](const TensorList& in) {
        ops::MoeRouting r = ops::moe_route(in[0], bias, K, 1.7f);
        return ops::add(dot(r.gates, rg), dot(r.affinity, ra));
      },
      {logits}, 1e-3f, 1e-3f, 1e-2f);
}

TEST(MoeRoute, TiesGoToTheLowerExpertIndex) {
  // Row 0: all equal -> experts 0, 1, 2. Row 1: experts 2 and 5 tie for first, 1 and 4 for third.
  Tensor logits = Tensor::from_vector<float>({2, 6}, {0, 0, 0, 0, 0, 0, /**/ -1, 0.5f, 2, -3, 0.5f, 2});
  ops::MoeRouting r = ops::moe_route(logits, Tensor::zeros({6}), 3, 1.0f);
  EXPECT_EQ(r.expert_index.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 2, 5, 1}));
  // A tie made by the bias: expert 3's raw affinity is lower but the bias lifts it level with expert 1.
  Tensor l2 = Tensor::from_vector<float>({1, 4}, {0.0f, 1.0f, -5.0f, 0.0f});
  const float s1 = 1.0f / (1.0f + std::exp(-1.0f)), s3 = 0.5f;
  Tensor bias = Tensor::from_vector<float>({4}, {0.0f, 0.0f, 0.0f, s1 - s3});
  ops::MoeRouting r2 = ops::moe_route(l2, bias, 1, 1.0f);
  const int32_t chosen = r2.expert_index.to_vector<int32_t>()[0];
  // The sums s1 + 0 and s3 + (s1 - s3) are equal or differ by an ulp; either way the pick is 1 or 3 and
  // repeatable, and with an exact tie it must be 1.
  if (s3 + (s1 - s3) == s1) {
    EXPECT_EQ(chosen, 1);
  }
  EXPECT_EQ(ops::moe_route(l2, bias, 1, 1.0f).expert_index.to_vector<int32_t>()[0], chosen);
}

TEST(MoeRoute, BiasSelectsButDoesNotGate) {
  Tensor logits = Tensor::from_vector<float>({1, 4}, {2.0f, 1.0f, 0.0f, -1.0f});
  Tensor bias = Tensor::from_vector<float>({4}, {0.0f, 0.0f, 0.0f, 10.0f});
  ops::MoeRouting r = ops::moe_route(logits, bias, 2, 3.0f);
  EXPECT_EQ(r.expert_index.to_vector<int32_t>(), (std::vector<int32_t>{3, 0}));
  const double s0 = 1 / (1 + std::exp(-2.0)), s3 = 1 / (1 + std::exp(1.0));
  auto g = r.gates.to_vector<float>();
  EXPECT_NEAR(g[0], 3.0 * s3 / (s0 + s3), 1e-6);  // raw affinities, not affinity + bias
  EXPECT_NEAR(g[1], 3.0 * s0 / (s0 + s3), 1e-6);
  EXPECT_EQ(r.expert_load.to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 0, 1}));
}

TEST(MoeRoute, NaNLogitRanksLast) {
  Tensor logits = Tensor::from_vector<float>({1, 3}, {std::nanf(""), -1.0f, -2.0f});
  ops::MoeRouting r = ops::moe_route(logits, Tensor::zeros({3}), 2, 1.0f);
  EXPECT_EQ(r.expert_index.to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
}

TEST(MoeRoute, Bf16LogitsAreRoutedInF32) {
  Tensor lf = separated_logits(9, 5, 21);
  Tensor lb = lf.to(DType::BF16);
  ops::MoeRouting a = ops::moe_route(lb.to(DType::F32), Tensor::zeros({5}), 2, 1.0f);
  ops::MoeRouting b = ops::moe_route(lb, Tensor::zeros({5}), 2, 1.0f);
  expect_bitwise(b.expert_index, a.expert_index, "index");
  expect_bitwise(b.gates, a.gates, "gates");
  expect_bitwise(b.affinity, a.affinity, "affinity");
}

// ---- routed experts ------------------------------------------------------------------------------

TEST(MoeExperts, MatchesPyTorch) {
  const auto fx = fixture();
  TensorList in;
  for (const char* name : {"x", "gates", "w1", "w3", "w2"})
    in.push_back(test::param(fx.get(std::string("experts.") + name)));
  Tensor index = fx.get("experts.index");
  Tensor y = ops::moe_experts(in[0], index, in[1], in[2], in[3], in[4]);
  test::expect_close(y, fx.get("experts.y"), 2e-5f, 1e-4f, "y");
  autograd::backward(y, fx.get("experts.dy"));
  const char* grads[] = {"experts.dx", "experts.dgates", "experts.dw1", "experts.dw3", "experts.dw2"};
  for (size_t i = 0; i < in.size(); ++i) test::expect_close(in[i].grad(), fx.get(grads[i]), 2e-5f, 1e-4f, grads[i]);
  // The last expert gets no token: its weight gradients are exactly zero, not garbage.
  const int64_t E = in[2].size(0), FC = in[2].size(1) * in[2].size(2);
  for (size_t i = 2; i < 5; ++i) {
    const float* g = in[i].grad().data<float>() + (E - 1) * FC;
    EXPECT_TRUE(std::all_of(g, g + FC, [](float v) { return v == 0.0f; })) << grads[i];
  }
}

TEST(MoeExperts, MatchesTheDenseReferenceAcrossTiles) {
  // ~230 rows per expert: two row blocks of the grouped GEMM each (96-128 rows, by kernel; or two
  // 128-row tiles on the oneDNN path), the second a tail; expert 3 gets nothing.
  const int64_t N = 350, C = 24, F = 20, E = 4, K = 2;
  ExpertInputs in = expert_inputs(N, C, F, E, K, 31, {3});
  Tensor y = ops::moe_experts(in.x, in.index, in.gates, in.w1, in.w3, in.w2);
  Tensor ref = Tensor::empty({N, C});
  cpu::moe_experts_forward_reference(in.x.data<float>(), in.index.data<int32_t>(), in.gates.data<float>(),
                                     in.w1.data<float>(), in.w3.data<float>(), in.w2.data<float>(), N, C, F, E, K,
                                     ref.data<float>());
  test::expect_close(y, ref, 1e-5f, 1e-4f, "y");
}

TEST(MoeExperts, FiniteDifferences) {
  const int64_t N = 9, C = 6, F = 5, E = 4, K = 2;
  ExpertInputs in = expert_inputs(N, C, F, E, K, 41);
  TensorList leaves = {test::param(in.x), test::param(in.gates), test::param(in.w1), test::param(in.w3),
                       test::param(in.w2)};
  test::gradcheck([&](const TensorList& t) { return ops::moe_experts(t[0], in.index, t[1], t[2], t[3], t[4]); }, leaves,
                  1e-2f, 2e-3f, 2e-2f);
}

TEST(MoeExperts, AllTokensOnOneExpert) {
  const int64_t N = 140, C = 8, F = 6, E = 3, K = 1;
  ExpertInputs in = expert_inputs(N, C, F, E, K, 51);
  in.index = ints({N, K}, std::vector<int32_t>(static_cast<size_t>(N), 1));
  Tensor w1 = test::param(in.w1), w2 = test::param(in.w2);
  Tensor y = ops::moe_experts(in.x, in.index, in.gates, w1, in.w3, w2);
  Tensor ref = Tensor::empty({N, C});
  cpu::moe_experts_forward_reference(in.x.data<float>(), in.index.data<int32_t>(), in.gates.data<float>(),
                                     in.w1.data<float>(), in.w3.data<float>(), in.w2.data<float>(), N, C, F, E, K,
                                     ref.data<float>());
  test::expect_close(y, ref, 1e-5f, 1e-4f, "y");
  autograd::backward(y, test::randn({N, C}, 52));
  for (const Tensor* g : {&w1, &w2}) {
    auto v = g->grad().to_vector<float>();
    const size_t per = v.size() / E;
    EXPECT_TRUE(std::all_of(v.begin(), v.begin() + per, [](float a) { return a == 0.0f; }));
    EXPECT_TRUE(std::any_of(v.begin() + per, v.begin() + 2 * per, [](float a) { return a != 0.0f; }));
    EXPECT_TRUE(std::all_of(v.begin() + 2 * per, v.end(), [](float a) { return a == 0.0f; }));
  }
}

TEST(MoeExperts, EmptyBatch) {
  ExpertInputs in = expert_inputs(0, 4, 3, 2, 1, 61);
  Tensor x = test::param(in.x), w1 = test::param(in.w1);
  Tensor y = ops::moe_experts(x, in.index, in.gates, w1, in.w3, in.w2);
  EXPECT_EQ(y.shape(), Shape({0, 4}));
  autograd::backward(ops::sum(y));
  auto g = w1.grad().to_vector<float>();
  EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
}

// The whole routed layer, fwd + bwd, on 1, 2 and 3 threads: every output and gradient bitwise equal.
TEST(MoeExperts, BitwiseIndependentOfThreadCount) {
  const int64_t B = 4, T = 150, C = 48, F = 40, E = 6, K = 2;
  const int saved = num_threads();
  struct Run {
    Tensor y, loss, dx, drouter, dw1, dw3, dw2;
  };
  auto run = [&](int threads, ops::MatmulPrecision precision) {
    set_num_threads(threads);
    Tensor x = test::param(test::randn({B * T, C}, 71));
    Tensor router = test::param(test::randn({E, C}, 72, 0.2f));
    Tensor w1 = test::param(test::randn({E, F, C}, 73, 0.2f)), w3 = test::param(test::randn({E, F, C}, 74, 0.2f));
    Tensor w2 = test::param(test::randn({E, C, F}, 75, 0.2f));
    ops::MoeRouting r = ops::moe_route(ops::linear(x, router), test::randn({E}, 76, 0.05f), K, 1.0f);
    Tensor y = ops::moe_experts(x, r.expert_index, r.gates, w1, w3, w2, precision);
    Tensor loss = ops::moe_sequence_balance_loss(r, B, T, 0.01f);
    autograd::backward(ops::add(dot(y, test::randn({B * T, C}, 77)), loss));
    return Run{y, loss, x.grad(), router.grad(), w1.grad(), w3.grad(), w2.grad()};
  };
  for (auto precision : {ops::MatmulPrecision::F32, ops::MatmulPrecision::BF16}) {
    Run one = run(1, precision);
    for (int threads : {2, 3}) {
      Run other = run(threads, precision);
      const std::string tag = " (" + std::to_string(threads) + " threads)";
      expect_bitwise(other.y, one.y, "y" + tag);
      expect_bitwise(other.loss, one.loss, "loss" + tag);
      expect_bitwise(other.dx, one.dx, "dx" + tag);
      expect_bitwise(other.drouter, one.drouter, "drouter" + tag);
      expect_bitwise(other.dw1, one.dw1, "dw1" + tag);
      expect_bitwise(other.dw3, one.dw3, "dw3" + tag);
      expect_bitwise(other.dw2, one.dw2, "dw2" + tag);
    }
  }
  set_num_threads(saved);
}

// Asking for one gradient at a time takes other paths through the backward (buffers that only some
// gradients need are skipped): each gradient must be bitwise the one the full backward gives.
TEST(MoeExperts, EachGradientAloneMatchesTheFullBackward) {
  const int64_t N = 200, C = 16, F = 12, E = 3, K = 2;
  ExpertInputs in = expert_inputs(N, C, F, E, K, 91);
  Tensor dy = test::randn({N, C}, 92);
  const TensorList values = {in.x, in.gates, in.w1, in.w3, in.w2};
  for (auto precision : {ops::MatmulPrecision::F32, ops::MatmulPrecision::BF16}) {
    auto run = [&](int only) {  // only = -1: every input requires grad
      TensorList l;
      for (int i = 0; i < 5; ++i)
        l.push_back(only < 0 || only == i ? test::param(values[static_cast<size_t>(i)])
                                          : values[static_cast<size_t>(i)]);
      autograd::backward(ops::moe_experts(l[0], in.index, l[1], l[2], l[3], l[4], precision), dy);
      return l;
    };
    const TensorList full = run(-1);
    for (int i = 0; i < 5; ++i) {
      const TensorList alone = run(i);
      expect_bitwise(alone[static_cast<size_t>(i)].grad(), full[static_cast<size_t>(i)].grad(),
                     "gradient " + std::to_string(i));
    }
  }
}

TEST(MoeRoute, Bf16LogitsGetABf16Gradient) {
  Tensor lf = separated_logits(7, 5, 93);
  Tensor lb = test::param(lf.to(DType::BF16)), l32 = test::param(lf.to(DType::BF16).to(DType::F32));
  Tensor rg = test::randn({7, 2}, 94);
  autograd::backward(dot(ops::moe_route(lb, Tensor::zeros({5}), 2, 1.0f).gates, rg));
  autograd::backward(dot(ops::moe_route(l32, Tensor::zeros({5}), 2, 1.0f).gates, rg));
  ASSERT_EQ(lb.grad().dtype(), DType::BF16);
  expect_bitwise(lb.grad(), l32.grad().to(DType::BF16), "dlogits");
}

// MatmulPrecision::BF16 (f32 tensors, bf16 GEMM operands) against f32, forward and every gradient.
TEST(MoeExperts, Bf16WithinTolerance) {
  const int64_t N = 300, C = 32, F = 24, E = 4, K = 2;
  ExpertInputs in = expert_inputs(N, C, F, E, K, 81);
  Tensor dy = test::randn({N, C}, 82);
  auto run = [&](ops::MatmulPrecision p) {
    TensorList l = {test::param(in.x), test::param(in.gates), test::param(in.w1), test::param(in.w3),
                    test::param(in.w2)};
    Tensor y = ops::moe_experts(l[0], in.index, l[1], l[2], l[3], l[4], p);
    autograd::backward(y, dy);
    TensorList out = {y};
    for (const Tensor& t : l) out.push_back(t.grad());
    return out;
  };
  TensorList f32 = run(ops::MatmulPrecision::F32), b16 = run(ops::MatmulPrecision::BF16);
  const char* names[] = {"y", "dx", "dgates", "dw1", "dw3", "dw2"};
  for (size_t i = 0; i < f32.size(); ++i) {
    // bf16 operands carry 8 significant bits: ~0.4% per operand, sums of C or F products.
    const float scale = [&] {
      float m = 0;
      for (float v : f32[i].to_vector<float>()) m = std::max(m, std::abs(v));
      return m;
    }();
    test::expect_close(b16[i], f32[i], 2e-2f * scale, 2e-2f, names[i]);
  }
  // Tensors already in bf16 (inference): the same GEMMs, the result in bf16.
  autograd::NoGradGuard no_grad;
  Tensor yb = ops::moe_experts(in.x.to(DType::BF16), in.index, in.gates, in.w1.to(DType::BF16), in.w3.to(DType::BF16),
                               in.w2.to(DType::BF16));
  EXPECT_EQ(yb.dtype(), DType::BF16);
  Tensor y_mixed = ops::moe_experts(in.x.to(DType::BF16).to(DType::F32), in.index, in.gates,
                                    in.w1.to(DType::BF16).to(DType::F32), in.w3.to(DType::BF16).to(DType::F32),
                                    in.w2.to(DType::BF16).to(DType::F32), ops::MatmulPrecision::BF16);
  expect_bitwise(yb, y_mixed.to(DType::BF16), "bf16 tensors vs MatmulPrecision::BF16");
}

// ---- balance loss and the whole layer ------------------------------------------------------------

TEST(MoeBalanceLoss, MatchesPyTorch) {
  const auto fx = fixture();
  auto shape = fx.get("balance.shape").to_vector<int32_t>();  // B, T, E, K
  Tensor logits = test::param(fx.get("balance.logits"));
  ops::MoeRouting r = ops::moe_route(logits, Tensor::zeros({shape[2]}), shape[3], 1.0f);
  Tensor loss = ops::moe_sequence_balance_loss(r, shape[0], shape[1], fx.get("balance.alpha").item());
  EXPECT_EQ(loss.shape(), Shape({}));
  EXPECT_NEAR(loss.item(), fx.get("balance.loss").item(), 1e-6 + 1e-5 * std::abs(fx.get("balance.loss").item()));
  autograd::backward(loss);
  test::expect_close(logits.grad(), fx.get("balance.dlogits"), 1e-7f, 1e-4f, "dlogits");
}

TEST(MoeBalanceLoss, FiniteDifferencesThroughTheAffinities) {
  const int64_t B = 2, T = 4, E = 5, K = 2;
  Tensor logits = test::param(separated_logits(B * T, E, 91));
  test::gradcheck(
      [&](const TensorList& in) {
        return ops::moe_sequence_balance_loss(ops::moe_route(in[0], Tensor::zeros({E}), K, 1.0f), B, T, 3.0f);
      },
      {logits}, 1e-3f, 1e-4f, 1e-2f);
}

TEST(MoeBalanceLoss, EvenRoutingWithUniformAffinitiesGivesAlpha) {
  // Every expert picked equally often and uniform affinities: f = 1 and P = 1/E, so the loss is alpha.
  const int64_t B = 2, T = 4, E = 4, K = 2;
  std::vector<float> l(static_cast<size_t>(B * T * E), 0.3f);
  ops::MoeRouting r = ops::moe_route(Tensor::from_vector<float>({B * T, E}, l), Tensor::zeros({E}), K, 1.0f);
  std::vector<int32_t> idx;
  for (int64_t n = 0; n < B * T; ++n)
    idx.insert(idx.end(), {static_cast<int32_t>((2 * n) % E), static_cast<int32_t>((2 * n + 1) % E)});
  r.expert_index = ints({B * T, K}, idx);
  EXPECT_NEAR(ops::moe_sequence_balance_loss(r, B, T, 0.25f).item(), 0.25f, 1e-7f);
}

TEST(MoeLayer, MatchesPyTorch) {
  const auto fx = fixture();
  auto shape = fx.get("layer.shape").to_vector<int32_t>();  // B, T, K
  TensorList in;
  for (const char* name : {"x", "router", "w1", "w3", "w2"})
    in.push_back(test::param(fx.get(std::string("layer.") + name)));
  ops::MoeRouting r =
      ops::moe_route(ops::linear(in[0], in[1]), fx.get("layer.bias"), shape[2], fx.get("layer.route_scale").item());
  expect_equal_ints(r.expert_index, fx.get("layer.index"), "index");
  Tensor y = ops::moe_experts(in[0], r.expert_index, r.gates, in[2], in[3], in[4]);
  Tensor loss = ops::moe_sequence_balance_loss(r, shape[0], shape[1], fx.get("layer.alpha").item());
  test::expect_close(y, fx.get("layer.y"), 2e-5f, 1e-4f, "y");
  EXPECT_NEAR(loss.item(), fx.get("layer.loss").item(), 1e-6);
  autograd::backward(ops::add(dot(y, fx.get("layer.dy")), loss));
  const char* grads[] = {"layer.dx", "layer.drouter", "layer.dw1", "layer.dw3", "layer.dw2"};
  for (size_t i = 0; i < in.size(); ++i) test::expect_close(in[i].grad(), fx.get(grads[i]), 2e-5f, 1e-4f, grads[i]);
}

TEST(MoeUpdateBias, MovesTowardTheMeanLoad) {
  // Loads 6, 2, 4, 4 (mean 4): the overloaded expert goes down, the underloaded up, the two at the mean
  // stay, as the seed's bias + gamma * sign(mean - load).
  Tensor bias = Tensor::from_vector<float>({4}, {0.5f, -0.25f, 0.0f, 1.0f});
  ops::moe_update_bias_(bias, ints({4}, {6, 2, 4, 4}), 1e-3f);
  EXPECT_EQ(bias.to_vector<float>(), (std::vector<float>{0.5f - 1e-3f, -0.25f + 1e-3f, 0.0f, 1.0f}));
  test::expect_error_mentions(
      [&] {
        ops::moe_update_bias_(bias, ints({3}, {1, 2, 3}), 1e-3f);
      },
      {"bias has shape [4]", "expert_load has shape [3]"});
  test::expect_error_mentions(
      [&] {
        ops::moe_update_bias_(bias, ints({4}, {1, -2, 3, 0}), 1e-3f);
      },
      {"expert_load[1] = -2"});
  test::expect_error_mentions([&] { ops::moe_update_bias_(bias, ints({4}, {1, 2, 3, 0}), -1.0f); }, {"gamma", "-1"});
}

// ---- errors --------------------------------------------------------------------------------------

TEST(MoeErrors, RouteRefusesBadArguments) {
  Tensor logits = test::randn({3, 4}, 1), bias = Tensor::zeros({4});
  test::expect_error_mentions([&] { ops::moe_route(logits, bias, 5, 1.0f); }, {"top_k=5", "E=4"});
  test::expect_error_mentions([&] { ops::moe_route(logits, bias, 0, 1.0f); }, {"top_k=0"});
  test::expect_error_mentions([&] { ops::moe_route(logits, bias, -2, 1.0f); }, {"top_k=-2"});
  test::expect_error_mentions([&] { ops::moe_route(logits, Tensor::zeros({5}), 2, 1.0f); }, {"bias", "[5]", "E=4"});
  test::expect_error_mentions([&] { ops::moe_route(logits, Tensor(), 2, 1.0f); }, {"bias is undefined"});
  test::expect_error_mentions([&] { ops::moe_route(logits, bias.to(DType::BF16), 2, 1.0f); }, {"bias", "bf16"});
  test::expect_error_mentions([&] { ops::moe_route(test::randn({12}, 1), bias, 2, 1.0f); }, {"[N, E]", "[12]"});
  test::expect_error_mentions(
      [&] {
        ops::moe_route(ints({3, 4}, std::vector<int32_t>(12)), bias, 2, 1.0f);
      },
      {"logits", "i32"});
  test::expect_error_mentions([&] { ops::moe_route(logits, bias, 2, 0.0f); }, {"route_scale", "0"});
  test::expect_error_mentions(
      [&] {
        ops::moe_route(logits, Tensor::from_vector<float>({4}, {0, std::nanf(""), 0, 0}), 2, 1.0f);
      },
      {"bias[1]", "nan"});
}

TEST(MoeErrors, ExpertsRefuseBadArguments) {
  ExpertInputs in = expert_inputs(5, 6, 4, 3, 2, 2);
  auto call = [&](const Tensor& x, const Tensor& index, const Tensor& gates, const Tensor& w1, const Tensor& w3,
                  const Tensor& w2) { ops::moe_experts(x, index, gates, w1, w3, w2); };
  Tensor bad = in.index.clone();
  bad.data<int32_t>()[7] = 3;  // token 3, slot 1
  test::expect_error_mentions([&] { call(in.x, bad, in.gates, in.w1, in.w3, in.w2); },
                              {"expert_index[3, 1] = 3", "E=3"});
  bad.data<int32_t>()[7] = -1;
  test::expect_error_mentions([&] { call(in.x, bad, in.gates, in.w1, in.w3, in.w2); }, {"expert_index[3, 1] = -1"});
  test::expect_error_mentions([&] { call(in.x, in.index.to(DType::F32), in.gates, in.w1, in.w3, in.w2); },
                              {"expert_index", "i32"});
  test::expect_error_mentions(
      [&] {
        call(in.x, ints({4, 2}, std::vector<int32_t>(8)), in.gates, in.w1, in.w3, in.w2);
      },
      {"expert_index has shape [4, 2]", "N=5"});
  test::expect_error_mentions(
      [&] {
        call(in.x, in.index, test::randn({5, 3}, 3), in.w1, in.w3, in.w2);
      },
      {"gates has shape [5, 3]", "[5, 2]"});
  test::expect_error_mentions([&] { call(in.x, in.index, in.gates.to(DType::BF16), in.w1, in.w3, in.w2); },
                              {"gates", "bf16"});
  test::expect_error_mentions(
      [&] {
        call(test::randn({5, 7}, 3), in.index, in.gates, in.w1, in.w3, in.w2);
      },
      {"w1 has shape [3, 4, 6]", "C=7"});
  test::expect_error_mentions([&] { call(test::randn({30}, 3), in.index, in.gates, in.w1, in.w3, in.w2); },
                              {"x must be [N, C]"});
  test::expect_error_mentions(
      [&] {
        call(in.x, in.index, in.gates, in.w1, test::randn({3, 5, 6}, 3), in.w2);
      },
      {"w3 has shape [3, 5, 6]", "[3, 4, 6]"});
  test::expect_error_mentions(
      [&] {
        call(in.x, in.index, in.gates, in.w1, in.w3, test::randn({3, 4, 6}, 3));
      },
      {"w2 has shape [3, 4, 6]", "[3, 6, 4]"});
  test::expect_error_mentions(
      [&] {
        call(in.x, in.index, in.gates, test::randn({3, 4}, 3), in.w3, in.w2);
      },
      {"w1 must be 3-D"});
  test::expect_error_mentions([&] { call(in.x, in.index, in.gates, in.w1.to(DType::BF16), in.w3, in.w2); },
                              {"w1 is bf16", "x is f32"});
  test::expect_error_mentions(
      [&] {
        call(in.x, ints({5, 2}, std::vector<int32_t>(10)), in.gates, in.w1, in.w3, in.w2.to(DType::I32));
      },
      {"w2 must be f32 or bf16", "i32"});
  // Recording through bf16 tensors is refused (MatmulPrecision::BF16 on f32 tensors is the training path).
  Tensor xb = in.x.to(DType::BF16);
  xb.set_requires_grad();
  test::expect_error_mentions(
      [&] { call(xb, in.index, in.gates, in.w1.to(DType::BF16), in.w3.to(DType::BF16), in.w2.to(DType::BF16)); },
      {"backward through bf16"});
}

TEST(MoeErrors, BalanceLossRefusesBadArguments) {
  ops::MoeRouting r = ops::moe_route(test::randn({6, 4}, 1), Tensor::zeros({4}), 2, 1.0f);
  test::expect_error_mentions([&] { ops::moe_sequence_balance_loss(r, 4, 2, 1.0f); },
                              {"batch=4", "seq=2", "= 8", "N=6"});
  test::expect_error_mentions([&] { ops::moe_sequence_balance_loss(r, 0, 6, 1.0f); }, {"batch=0"});
  test::expect_error_mentions([&] { ops::moe_sequence_balance_loss(r, 2, 3, std::nanf("")); }, {"alpha", "nan"});
  ops::MoeRouting bad = r;
  bad.expert_index = r.expert_index.clone();
  bad.expert_index.data<int32_t>()[5] = 9;
  test::expect_error_mentions([&] { ops::moe_sequence_balance_loss(bad, 2, 3, 1.0f); },
                              {"expert_index[2, 1] = 9", "E=4"});
  bad.expert_index = Tensor();
  test::expect_error_mentions([&] { ops::moe_sequence_balance_loss(bad, 2, 3, 1.0f); }, {"must be defined"});
}
