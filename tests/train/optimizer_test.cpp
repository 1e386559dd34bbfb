#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/optimizer.h"
#include "core/autograd.h"
#include "ops/elementwise.h"
#include "ops/optimizer.h"
#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

// A whole parameter (one process: no mesh, no pipe stages) named `name` holding `value`.
nn::Parameter parameter(const std::string& name, Tensor value) {
  nn::Parameter p;
  p.name = name;
  p.global_shape = value.shape();
  p.value = std::move(value);
  return p;
}

}  // namespace

TEST(CosineSchedule, MatchesTheCS336ReferenceValues) {
  // The values of CS336's test_get_lr_cosine_schedule (max 1, min 0.1, warmup 7, cosine 21).
  const double expected[] = {0.0, 0.14285714285714285, 0.2857142857142857, 0.42857142857142855, 0.5714285714285714,
                             0.7142857142857143, 0.8571428571428571, 1.0, 0.9887175604818206, 0.9554359905560885,
                             0.9018241671106134, 0.8305704108364301, 0.7452476826029011, 0.6501344202803414, 0.55,
                             0.44986557971965857, 0.3547523173970989, 0.26942958916356996, 0.19817583288938662,
                             0.14456400944391146, 0.11128243951817937, 0.1, 0.1, 0.1, 0.1};
  for (int t = 0; t < 25; ++t) EXPECT_NEAR(train::cosine_lr(t, 1.0f, 0.1f, 7, 21), expected[t], 1e-6) << "t=" << t;
}

TEST(AdamW, SingleStepByHand) {
  nn::Parameter p = parameter("w", Tensor::from_vector<float>({2}, {1.0f, -2.0f}));
  p.value.set_requires_grad();
  p.value.set_grad(Tensor::from_vector<float>({2}, {0.5f, -0.25f}));
  train::AdamW opt({&p}, {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f});
  opt.step();
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * sign(g) (up to eps); decay first.
  auto w = p.value.to_vector<float>();
  EXPECT_NEAR(w[0], 1.0f * (1 - 0.1f * 0.01f) - 0.1f, 1e-6);
  EXPECT_NEAR(w[1], -2.0f * (1 - 0.1f * 0.01f) + 0.1f, 1e-6);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_NEAR(opt.exp_avg(0).to_vector<float>()[0], 0.05f, 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq(0).to_vector<float>()[0], 0.00025f, 1e-8);  // (1 - beta2) rounds in f32
}

TEST(AdamW, ZeroGradDropsGradientsAndStepSkipsParametersWithoutOne) {
  // torch's zero_grad(set_to_none=True): a parameter that got no gradient is neither decayed nor moved.
  nn::Parameter used = parameter("used", Tensor::from_vector<float>({2}, {1.0f, -2.0f}));
  nn::Parameter unused = parameter("unused", Tensor::from_vector<float>({2}, {3.0f, 4.0f}));
  used.value.set_requires_grad();
  unused.value.set_requires_grad();
  train::AdamW opt({&used, &unused}, {.lr = 0.1f, .weight_decay = 0.5f});
  used.value.set_grad(Tensor::from_vector<float>({2}, {0.5f, -0.25f}));
  unused.value.set_grad(Tensor::from_vector<float>({2}, {1.0f, 1.0f}));
  opt.zero_grad();
  EXPECT_FALSE(used.value.grad().defined());
  EXPECT_FALSE(unused.value.grad().defined());
  used.value.set_grad(Tensor::from_vector<float>({2}, {0.5f, -0.25f}));
  opt.step();
  EXPECT_NE(used.value.to_vector<float>()[0], 1.0f);
  EXPECT_EQ(unused.value.to_vector<float>(), (std::vector<float>{3.0f, 4.0f}));
  EXPECT_EQ(opt.exp_avg(1).to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
}

TEST(AdamW, InvalidOptionsNameTheKey) {
  nn::Parameter p = parameter("w", Tensor::zeros({1}));
  try {
    train::AdamW opt({&p}, {.lr = 1e-3f, .beta1 = 1.5f});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta1"), std::string::npos);
  }
}

TEST(AdamW, AStepThatFailsIsNotCountedAndChangesNothing) {
  // The second parameter's gradient is BF16: the step is refused before the first parameter moves, and
  // the step count (which sets the bias correction of every later step) stays where it was.
  nn::Parameter a = parameter("a", Tensor::from_vector<float>({2}, {1.0f, -2.0f}));
  nn::Parameter b = parameter("b", Tensor::from_vector<float>({2}, {3.0f, 4.0f}));
  train::AdamW opt({&a, &b}, {.lr = 0.1f});
  a.value.set_grad(Tensor::from_vector<float>({2}, {0.5f, -0.25f}));
  b.value.set_grad(Tensor::from_vector<float>({2}, {1.0f, 1.0f}).to(DType::BF16));
  try {
    opt.step();
    FAIL() << "a BF16 gradient was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AdamW: parameter 'b' is f32 with a bf16 gradient"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(a.value.to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(opt.exp_avg(0).to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
}

TEST(ClipGradNorm, SkipsMissingAndLeavesSmallGradientsAlone) {
  Tensor a = Tensor::from_vector<float>({2}, {3.0f, 4.0f});
  std::vector<Tensor> grads{a, Tensor()};
  EXPECT_NEAR(train::clip_grad_norm(grads, 10.0), 5.0, 1e-9);
  EXPECT_EQ(a.to_vector<float>()[0], 3.0f);
  EXPECT_NEAR(train::clip_grad_norm(grads, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(a.to_vector<float>()[0], 3.0f / (5.0f + 1e-6f), 1e-6);
}

// The fast AdamW kernel (blocks, omp simd, threads) against the one-element-at-a-time oracle, bitwise,
// with and without the fused bf16 copy of the weights; the copy is the updated weights rounded.
TEST(AdamW, KernelMatchesTheReferenceAndWritesTheBf16CopyInTheSamePass) {
  const int64_t n = 70001;  // several parallel chunks and a partial last block
  Tensor p0 = test::randn({n}, 1), g = test::randn({n}, 2), m0 = test::randn({n}, 3);
  Tensor v0 = Tensor::from_vector<float>({n}, [&] {
    std::vector<float> v = test::randn({n}, 4).to_vector<float>();
    for (float& x : v) x = x * x;  // second moments are >= 0
    return v;
  }());
  for (int step = 1; step <= 3; ++step) {
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
    Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
    Tensor pr = p0.clone(), mr = m0.clone(), vr = v0.clone();
    Tensor pc = p0.clone(), mc = m0.clone(), vc = v0.clone();
    Tensor copy = Tensor::empty({n}, DType::BF16), copy_ref = Tensor::empty({n}, DType::BF16);
    cpu::adamw_update(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), n, 1e-3f, 0.9f, 0.95f,
                      1e-8f, 0.1f, bc1, bc2);
    cpu::adamw_update(pc.data<float>(), g.data<float>(), mc.data<float>(), vc.data<float>(), n, 1e-3f, 0.9f, 0.95f,
                      1e-8f, 0.1f, bc1, bc2, copy.data<bf16>());
    cpu::adamw_update_reference(pr.data<float>(), g.data<float>(), mr.data<float>(), vr.data<float>(), n, 1e-3f, 0.9f,
                                0.95f, 1e-8f, 0.1f, bc1, bc2, copy_ref.data<bf16>());
    const float *a = p.data<float>(), *b = pr.data<float>(), *c = pc.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], b[i]) << "param " << i << " step " << step;
      ASSERT_EQ(c[i], b[i]) << "param with the copy " << i;
      ASSERT_EQ(m.data<float>()[i], mr.data<float>()[i]) << "m " << i;
      ASSERT_EQ(v.data<float>()[i], vr.data<float>()[i]) << "v " << i;
      ASSERT_EQ(vc.data<float>()[i], vr.data<float>()[i]) << "v with the copy " << i;
      ASSERT_EQ(copy.data<bf16>()[i].bits, copy_ref.data<bf16>()[i].bits) << "bf16 copy " << i;
      ASSERT_EQ(copy.data<bf16>()[i].bits, bf16::from_float(b[i]).bits) << "bf16 copy " << i;
    }
  }
}

// Every operation of the update rounds as written, no fused multiply-adds (optimizer.cpp is compiled with
// -ffp-contract=off): each step below goes through a volatile float, which the compiler cannot fuse
// across. GCC once fused `param * decay` into the vectorised loop's FMA and `p - step * q` into the
// scalar one's, so the weights depended on how the loop was compiled.
TEST(AdamW, EveryOperationRoundsAsWritten) {
  const int64_t n = 4099;
  std::vector<float> p = test::randn({n}, 11).to_vector<float>(), g = test::randn({n}, 12).to_vector<float>();
  std::vector<float> m = test::randn({n}, 13).to_vector<float>(), v = test::randn({n}, 14).to_vector<float>();
  for (float& x : v) x = x * x;
  const std::vector<float> p0 = p, m0 = m, v0 = v;
  const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.95, 3);
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, bc1, bc2);
  const float decay = 1.0f - lr * wd, step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  for (int64_t i = 0; i < n; ++i) {
    volatile float t;
    t = beta1 * m0[i];
    volatile float u = (1.0f - beta1) * g[i];
    const float mi = t + u;
    u = (1.0f - beta2) * g[i];
    u = u * g[i];  // ((1 - beta2) * g) * g, as the kernel associates it
    t = beta2 * v0[i];
    const float vi = t + u;
    t = std::sqrt(vi);
    t = t / bc2_sqrt;
    t = t + eps;
    t = mi / t;
    t = step_size * t;
    volatile float decayed = p0[i] * decay;
    const float expected = decayed - t;
    ASSERT_EQ(m[i], mi) << "m " << i;
    ASSERT_EQ(v[i], vi) << "v " << i;
    ASSERT_EQ(p[i], expected) << "param " << i;
  }
}

TEST(AdamW, KeepsAMixedPrecisionLayersBf16CopyCurrent) {
  nn::Parameter p = parameter("w", test::randn({3, 300}, 5));
  p.value.set_requires_grad();
  // What a bf16 layer does on its first forward: allocate the copy (not yet current: the optimizer
  // has not written it).
  Tensor first = nn::bf16_weight_of(p);
  EXPECT_FALSE(p.bf16_copy_current);
  EXPECT_EQ(first.dtype(), DType::BF16);
  train::AdamW opt({&p}, {.lr = 0.01f});
  p.value.set_grad(test::randn({3, 300}, 6));
  opt.step();
  EXPECT_TRUE(p.bf16_copy_current);
  Tensor copy = nn::bf16_weight_of(p);
  EXPECT_EQ(copy.raw_data(), p.bf16_copy.raw_data()) << "a current copy is reused, not converted again";
  const std::vector<float> w = p.value.to_vector<float>();
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(copy.data<bf16>()[i].bits, bf16::from_float(w[i]).bits) << i;
  // Written from elsewhere: the copy no longer matches until the layer converts again.
  p.value.fill_(0.25f);
  p.value_changed();
  EXPECT_FALSE(p.bf16_copy_current);
  EXPECT_EQ(nn::bf16_weight_of(p).data<bf16>()[7].to_float(), 0.25f);
  // Outside training (no autograd), a layer gets a fresh conversion and the parameter is left alone.
  {
    autograd::NoGradGuard no_grad;
    Tensor fresh = nn::bf16_weight_of(p);
    EXPECT_NE(fresh.raw_data(), p.bf16_copy.raw_data());
  }
}

// The ops train::AdamW, clipping and the mesh's gradient sums go through (ops/optimizer.h,
// ops/elementwise.h): the kernels' bits, and arguments refused by value.
TEST(OptimizerOps, AdamwUpdateIsTheKernelsBitsAndNamesBadArguments) {
  const int64_t n = 3000;  // several of the kernel's 1024-element blocks, and a tail
  const Tensor g = test::randn({n}, 2, 0.1f);
  Tensor p = test::randn({n}, 1), m = test::randn({n}, 3, 0.01f), v = test::randn({n}, 4, 0.01f);
  float* vd = v.data<float>();
  for (int64_t i = 0; i < n; ++i) vd[i] = vd[i] * vd[i];  // second moments are >= 0
  Tensor kp = p.clone(), km = m.clone(), kv = v.clone();
  Tensor copy = Tensor::empty({n}, DType::BF16), kcopy = Tensor::empty({n}, DType::BF16);
  const ops::AdamWStep step{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0 - 0.9 * 0.9, 1.0 - 0.95 * 0.95};
  ops::adamw_update(p, g, m, v, step, copy);
  cpu::adamw_update(kp.data<float>(), g.data<float>(), km.data<float>(), kv.data<float>(), n, step.lr, step.beta1,
                    step.beta2, step.eps, step.weight_decay, step.bias_correction1, step.bias_correction2,
                    kcopy.data<bf16>());
  EXPECT_EQ(p.to_vector<float>(), kp.to_vector<float>());
  EXPECT_EQ(m.to_vector<float>(), km.to_vector<float>());
  EXPECT_EQ(v.to_vector<float>(), kv.to_vector<float>());
  EXPECT_EQ(std::memcmp(copy.raw_data(), kcopy.raw_data(), copy.nbytes()), 0);

  Tensor short_grad = Tensor::zeros({n - 1});
  EXPECT_NE(test::error_of([&] { ops::adamw_update(p, short_grad, m, v, step); })
                .find("adamw_update has shape [3000] but its gradient has [2999]"),
            std::string::npos);
  Tensor wide_copy = Tensor::empty({n + 1}, DType::BF16);
  EXPECT_NE(test::error_of([&] { ops::adamw_update(p, g, m, v, step, wide_copy); })
                .find("the bf16 copy bf16[3001] on cpu is not bf16 of the parameter's shape [3000]"),
            std::string::npos);
}

TEST(OptimizerOps, SumOfSquaresScaleAndConvertAreTheKernels) {
  const Tensor a = test::randn({1000}, 5), b = test::randn({77}, 6);
  const double expected = 0.0 + cpu::sum_of_squares(a.data<float>(), a.numel()) + cpu::sum_of_squares(b.data<float>(), b.numel());
  EXPECT_EQ(ops::sum_of_squares({a, Tensor(), b}), expected);  // undefined tensors skipped, order kept
  EXPECT_EQ(ops::sum_of_squares(a), cpu::sum_of_squares(a.data<float>(), a.numel()));
  EXPECT_NE(test::error_of([&] { ops::sum_of_squares({a, a.to(DType::BF16)}); })
                .find("sum_of_squares: tensor 1 is bf16[1000] on cpu; expected f32"),
            std::string::npos);

  Tensor s = a.clone();
  ops::scale_(s, 0.37f);
  std::vector<float> want = a.to_vector<float>();
  cpu::scale_forward(want.data(), want.data(), 0.37f, static_cast<int64_t>(want.size()));
  EXPECT_EQ(s.to_vector<float>(), want);

  Tensor c = Tensor::empty({1000}, DType::BF16);
  ops::convert_(c, a);
  const Tensor to = a.to(DType::BF16);
  EXPECT_EQ(std::memcmp(c.raw_data(), to.raw_data(), c.nbytes()), 0);
  Tensor c2 = Tensor::empty({999}, DType::BF16);
  EXPECT_NE(test::error_of([&] { ops::convert_(c2, a); }).find("convert_: dst has shape [999] but src has [1000]"),
            std::string::npos);
}
