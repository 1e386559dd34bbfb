// The first 50 training steps against PyTorch (fixtures/make_train_reference.py): same initial weights,
// same batches, the trainer's step (warmup + cosine LR, backward, clip at 1.0, AdamW).
// Stated tolerance: every loss within 1e-5 of PyTorch's (float32 on both sides; the two differ only in
// summation order, which drifts slowly over the steps; measured worst: 4.8e-7).
#include "models/llama/model.h"
#include "support/model_fixture.h"
#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;

TEST(ReferenceRun, First50LossesMatchPyTorch) {
  test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/train_reference.json");
  llama::Config cfg = test::llama_config_from_fixture(f);
  llama::TransformerLM model(cfg, 0);
  for (nn::Parameter* p : model.parameters()) model.load_parameter(p->name, f.get("init." + p->name));
  train::AdamW opt(model.parameters(), {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
  auto expected = f.get("losses").to_vector<float>();
  auto expected_lr = f.get("lrs").to_vector<float>();
  double worst = 0;
  for (int step = 0; step < 50; ++step) {
    const float lr = train::cosine_lr(step, 3e-3f, 3e-4f, 5, 50);
    ASSERT_NEAR(lr, expected_lr[static_cast<size_t>(step)], 1e-9);
    opt.zero_grad();
    Tensor loss = model.loss(f.get("batch." + std::to_string(step) + ".inputs"),
                             f.get("batch." + std::to_string(step) + ".targets"));
    loss.backward();
    train::clip_grad_norm(train::gradients_of(model.parameters()), 1.0);
    opt.step(lr);
    const double diff = std::fabs(loss.item() - expected[static_cast<size_t>(step)]);
    worst = std::max(worst, diff);
    EXPECT_LT(diff, 1e-5) << "step " << step << ": loom " << loss.item() << ", PyTorch " << expected[static_cast<size_t>(step)];
  }
  EXPECT_LT(expected.back(), expected.front() - 1.0) << "the reference run should learn";
  std::printf("worst |loom - PyTorch| over 50 steps: %.2e\n", worst);
}
