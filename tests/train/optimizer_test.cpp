#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;

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
  nn::Parameter p{"w", Tensor::from_vector<float>({2}, {1.0f, -2.0f}), Shape{2}, {}};
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
  nn::Parameter used{"used", Tensor::from_vector<float>({2}, {1.0f, -2.0f}), Shape{2}, {}};
  nn::Parameter unused{"unused", Tensor::from_vector<float>({2}, {3.0f, 4.0f}), Shape{2}, {}};
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
  nn::Parameter p{"w", Tensor::zeros({1}), Shape{1}, {}};
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
  nn::Parameter a{"a", Tensor::from_vector<float>({2}, {1.0f, -2.0f}), Shape{2}, {}};
  nn::Parameter b{"b", Tensor::from_vector<float>({2}, {3.0f, 4.0f}), Shape{2}, {}};
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
