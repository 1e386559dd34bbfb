// The first 50 training steps against PyTorch, for each family (fixtures/make_train_reference.py for the
// Llama, fixtures/make_gpt2_train_reference.py for GPT-2 with a tied head and biases): same initial
// weights, same batches, the trainer's step (warmup + cosine LR, backward, clip at 1.0, AdamW).
// Stated tolerance: every loss within 1e-5 of PyTorch's (float32 on both sides; the two differ only in
// summation order, which drifts slowly over the steps).
#include "models/llama/model.h"
#include "models/model_config.h"
#include "support/model_fixture.h"
#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

void expect_reference_run(const test::Fixture& f, models::LanguageModel& model) {
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
  std::printf("%s: worst |loom - PyTorch| over 50 steps: %.2e\n", model.arch().c_str(), worst);
}

}  // namespace

TEST(ReferenceRun, First50LossesMatchPyTorch) {
  test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/train_reference.json");
  llama::TransformerLM model(test::llama_config_from_fixture(f), 0);
  expect_reference_run(f, model);
}

TEST(ReferenceRun, Gpt2First50LossesMatchPyTorch) {
  test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/gpt2_train_reference.json");
  nlohmann::json config = f.raw("config_json");
  config["arch"] = "gpt2";
  auto model = models::ModelConfig::from_json(config).build(0);
  expect_reference_run(f, *model);
}
