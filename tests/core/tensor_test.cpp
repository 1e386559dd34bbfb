#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/shape.h"

using namespace loom;

TEST(Shape, NegativeIndexAndErrors) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.numel_before(-1), 6);
  EXPECT_THROW(s[3], Error);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
}

TEST(Tensor, FromVectorViewClone) {
  Tensor t = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor v = t.view({4});
  EXPECT_EQ(v.raw_data(), t.raw_data());
  Tensor c = t.clone();
  c.fill_(7);
  EXPECT_EQ(t.to_vector<float>()[0], 1.0f);
  EXPECT_THROW(t.view({3}), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Tensor, Bf16RoundTripRoundsToNearestEven) {
  Tensor t = Tensor::from_vector<float>({3}, {1.0f, 1.00390625f, -2.5f});
  Tensor b = t.to(DType::BF16).to(DType::F32);
  auto v = b.to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 1.0f);  // halfway between 1 and 1+2^-7: ties to even
  EXPECT_EQ(v[2], -2.5f);
}

TEST(Autograd, ChainAndFanOut) {
  Tensor x = Tensor::from_vector<float>({3}, {1, 2, 3});
  x.set_requires_grad();
  Tensor y = ops::mul(x, x);         // x^2
  Tensor z = ops::add(y, x);         // x^2 + x
  Tensor loss = ops::sum(ops::reshape(z, {3, 1}));
  loss.backward();
  auto g = x.grad().to_vector<float>();
  EXPECT_FLOAT_EQ(g[0], 3.0f);
  EXPECT_FLOAT_EQ(g[1], 5.0f);
  EXPECT_FLOAT_EQ(g[2], 7.0f);
  // Second backward on a fresh graph accumulates into the leaf.
  ops::sum(x).backward();
  EXPECT_FLOAT_EQ(x.grad().to_vector<float>()[0], 4.0f);
}

TEST(Autograd, LeavesSharingOneGradientGetSeparateBuffers) {
  // add's backward hands the same dy to both inputs; a leaf may take a gradient buffer without a copy only
  // when nothing else holds it, so scaling one leaf's grad in place (as clipping does) leaves the other.
  Tensor a = Tensor::from_vector<float>({2}, {1, 2}), b = Tensor::from_vector<float>({2}, {3, 4});
  a.set_requires_grad();
  b.set_requires_grad();
  ops::sum(ops::add(a, b)).backward();
  ASSERT_NE(a.grad().raw_data(), b.grad().raw_data());
  a.grad().zero_();
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  x.set_requires_grad();
  autograd::NoGradGuard guard;
  Tensor y = ops::scale(x, 2.0f);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, LeafGradHookFiresOnceWhenTheGradientIsFinal) {
  // a feeds two ops (its gradient arrives twice), b one, c none (no grad): the hook sees each leaf that
  // needs a gradient once, after its last contribution, with .grad then already final.
  Tensor a = Tensor::from_vector<float>({2}, {1, 2}), b = Tensor::from_vector<float>({2}, {3, 4});
  Tensor c = Tensor::from_vector<float>({2}, {5, 6});
  a.set_requires_grad();
  b.set_requires_grad();
  std::vector<std::pair<TensorImpl*, std::vector<float>>> seen;
  {
    autograd::LeafGradHook hook([&](TensorImpl* leaf) { seen.push_back({leaf, leaf->grad.to_vector<float>()}); });
    ops::sum(ops::add(ops::mul(a, b), ops::mul(a, c))).backward();  // d/da = b + c, d/db = a
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].first, seen[1].first);
  for (const auto& [leaf, grad] : seen) {
    if (leaf == a.impl()) EXPECT_EQ(grad, (std::vector<float>{8, 10}));
    else if (leaf == b.impl()) EXPECT_EQ(grad, (std::vector<float>{1, 2}));
    else ADD_FAILURE() << "the hook saw a leaf that needs no gradient";
  }
  // Out of scope, no hook: backward() runs as before.
  seen.clear();
  ops::sum(a).backward();
  EXPECT_TRUE(seen.empty());
}

TEST(Rng, CounterBasedIndependentOfSplitting) {
  RngKey key = RngKey::from_seed(42).fold_in("layers.0.attn.q_proj.weight");
  std::vector<float> whole(1000), half(500);
  fill_normal(whole.data(), 1000, key, 0, 0.0f, 1.0f);
  fill_normal(half.data(), 500, key, 500, 0.0f, 1.0f);  // the second half, drawn as a shard would be
  for (int i = 0; i < 500; ++i) EXPECT_EQ(whole[500 + i], half[i]);
  EXPECT_NE(RngKey::from_seed(42).fold_in("a"), RngKey::from_seed(42).fold_in("b"));
}

TEST(Rng, TruncatedNormalStaysInRangeWithUnitishMoments) {
  std::vector<float> v(200000);
  fill_truncated_normal(v.data(), static_cast<int64_t>(v.size()), RngKey::from_seed(1), 0, 0.0f, 2.0f, -6.0f, 6.0f);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_GE(x, -6.0f);
    ASSERT_LE(x, 6.0f);
    sum += x;
    sq += x * x;
  }
  double mean = sum / v.size(), var = sq / v.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  // Variance of N(0, 4) truncated at +-3 sigma is 4 * 0.9733.
  EXPECT_NEAR(var, 4.0 * 0.9733, 0.05);
}

TEST(Device, ParseAndErrors) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::parse("cuda").index(), 0);
  EXPECT_THROW(Device::parse("tpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  // A CUDA tensor cannot be allocated in a CPU-only build: a clear error, not a crash.
  EXPECT_THROW(Tensor::empty({2}, DType::F32, Device::cuda(0)), Error);
}
