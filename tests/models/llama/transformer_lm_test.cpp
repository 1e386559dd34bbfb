// The Llama-style TransformerLM against an independent PyTorch implementation
// (fixtures/make_fixtures.py): logits, loss, every parameter's gradient, and 5 AdamW steps.
#include "core/allocator.h"
#include "core/parallel.h"
#include "models/llama/model.h"
#include "support/model_fixture.h"
#include "support/op_test.h"
#include "ops/rope.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

const test::Fixture& fixture() {
  static test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/transformer_lm.json");
  return f;
}

llama::Config fixture_config() { return test::llama_config_from_fixture(fixture()); }

std::unique_ptr<llama::TransformerLM> fixture_model() {
  auto model = std::make_unique<llama::TransformerLM>(fixture_config(), 0);
  for (nn::Parameter* p : model->parameters()) model->load_parameter(p->name, fixture().get("init." + p->name));
  return model;
}

}  // namespace

TEST(TransformerLM, ParameterNamesAreTheCS336Names) {
  llama::TransformerLM model(fixture_config(), 0);
  std::vector<std::string> names;
  for (nn::Parameter* p : model.parameters()) names.push_back(p->name);
  EXPECT_EQ(names.front(), "token_embeddings.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.attn.output_proj.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.0.ffn.w3.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.ln2.weight"), names.end());
  int64_t total = 0;
  for (nn::Parameter* p : model.parameters()) total += p->value.numel();
  EXPECT_EQ(total, fixture_config().total_params());
  // Every fixture parameter exists in the model with the same shape.
  for (nn::Parameter* p : model.parameters()) EXPECT_EQ(p->value.shape(), fixture().get("init." + p->name).shape());
}

TEST(TransformerLM, LogitsLossAndEveryGradientMatchPyTorch) {
  auto model = fixture_model();
  Tensor ids = fixture().get("ids"), targets = fixture().get("targets");
  Tensor logits = model->forward(ids);
  test::expect_close(logits, fixture().get("logits"), 2e-4f, 1e-4f, "logits");
  Tensor loss = model->loss(ids, targets);
  EXPECT_NEAR(loss.item(), fixture().get("loss").item(), 2e-5);
  loss.backward();
  for (nn::Parameter* p : model->parameters()) {
    test::expect_close(p->value.grad(), fixture().get("grad." + p->name), 2e-5f, 1e-3f, "grad of " + p->name);
  }
}

TEST(TransformerLM, FiveAdamWStepsMatchTorchOptimAdamW) {
  auto model = fixture_model();
  train::AdamW opt(model->parameters(), {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
  auto expected = fixture().get("adamw.losses").to_vector<float>();
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    Tensor loss = model->loss(fixture().get("adamw.ids." + std::to_string(step)),
                              fixture().get("adamw.targets." + std::to_string(step)));
    EXPECT_NEAR(loss.item(), expected[static_cast<size_t>(step)], 1e-4) << "step " << step;
    loss.backward();
    opt.step();
  }
  for (nn::Parameter* p : model->parameters()) {
    test::expect_close(p->value, fixture().get("adamw.final." + p->name), 1e-5f, 1e-4f, "after 5 steps: " + p->name);
  }
}

TEST(TransformerLM, GradientClippingMatchesTorch) {
  auto model = fixture_model();
  model->loss(fixture().get("ids"), fixture().get("targets")).backward();
  auto grads = train::gradients_of(model->parameters());
  double norm = train::clip_grad_norm(grads, 0.5);
  EXPECT_NEAR(norm, fixture().get("clip.norm").item(), 1e-4 * norm);
  test::expect_close(model->parameter("lm_head.weight").value.grad(), fixture().get("clip.lm_head"), 1e-6f, 1e-4f,
                     "clipped lm_head grad");
  EXPECT_NEAR(train::global_grad_norm(grads), 0.5, 1e-5);
}

TEST(TransformerLM, SequenceLengthOneAndBatchOne) {
  auto model = fixture_model();
  Tensor ids = Tensor::from_vector<int32_t>({1, 1}, {5});
  Tensor logits = model->forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{1, 1, 37}));
  // The first position does not depend on later tokens (causality): compare with the fixture batch.
  Tensor full_ids = fixture().get("ids");
  Tensor first = Tensor::from_vector<int32_t>({1, 1}, {full_ids.data<int32_t>()[0]});
  auto a = model->forward(first).to_vector<float>();
  auto b = fixture().get("logits").to_vector<float>();
  for (int v = 0; v < 37; ++v) EXPECT_NEAR(a[static_cast<size_t>(v)], b[static_cast<size_t>(v)], 2e-4);
}

TEST(TransformerLM, InvalidConfigurationsNameTheValues) {
  llama::Config c = fixture_config();
  c.num_heads = 5;  // 24 % 5 != 0
  try {
    llama::TransformerLM model(c, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d_model=24"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_heads=5"), std::string::npos) << e.what();
  }
  auto model = fixture_model();
  Tensor too_long = Tensor::zeros({1, 17}, DType::I32);
  EXPECT_THROW(model->forward(too_long), Error);
  Tensor bad_id = Tensor::from_vector<int32_t>({1, 2}, {3, 99});
  EXPECT_THROW(model->forward(bad_id), Error);
}

TEST(TransformerLM, InitialisationIsKeyedAndThreadCountIndependent) {
  llama::Config c = fixture_config();
  set_num_threads(1);
  llama::TransformerLM a(c, 7);
  set_num_threads(2);
  llama::TransformerLM b(c, 7);
  llama::TransformerLM other(c, 8);
  auto pa = a.parameters(), pb = b.parameters(), po = other.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]->value.to_vector<float>(), pb[i]->value.to_vector<float>()) << pa[i]->name;
  }
  EXPECT_NE(pa[0]->value.to_vector<float>(), po[0]->value.to_vector<float>());
  // Linear init: truncated normal with std sqrt(2/(in+out)), within +-3 std.
  const Tensor& w = a.parameter("layers.0.ffn.w1.weight").value;
  float bound = 3.0f * std::sqrt(2.0f / (24 + 40));
  for (float v : w.to_vector<float>()) ASSERT_LE(std::fabs(v), bound);
}

TEST(TransformerLM, TrainStepAllocatesNothingAfterTheFirst) {
  llama::Config c = fixture_config();
  llama::TransformerLM model(c, 3);
  train::AdamW opt(model.parameters(), {.lr = 1e-3f});
  Tensor ids = fixture().get("ids"), targets = fixture().get("targets");
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = model.loss(ids, targets);
    loss.backward();
    train::clip_grad_norm(train::gradients_of(model.parameters()), 1.0);
    opt.step();
  };
  step();
  int64_t after_first = allocator_for(Device::cpu()).stats().system_allocations;
  for (int i = 2; i <= 4; ++i) {
    step();
    EXPECT_EQ(allocator_for(Device::cpu()).stats().system_allocations, after_first) << "step " << i;
  }
}

TEST(RotaryPositionalEmbedding, CachedTablesGiveTheComputedRotation) {
  nn::RotaryPositionalEmbedding rope(10000.0f, 8, 32);
  ASSERT_EQ(rope.cache.cos.shape(), (Shape{32, 4}));
  Tensor x = test::randn({2, 5, 8}, 3);
  Tensor positions = Tensor::from_vector<int32_t>({5}, {0, 31, 7, 7, 2});  // arbitrary, repeated
  test::expect_close(rope.forward(x, positions), ops::rope(x, positions, 10000.0f), 0.0f, 0.0f, "cached vs computed");
  Tensor beyond = Tensor::from_vector<int32_t>({5}, {0, 1, 2, 3, 32});
  try {
    rope.forward(x, beyond);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 32"), std::string::npos) << e.what();
  }
}
