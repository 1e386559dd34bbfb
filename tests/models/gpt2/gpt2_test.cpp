// The GPT-2 family against an independent float64 PyTorch GPT-2 (fixtures/make_gpt2_fixtures.py, itself
// checked against transformers' GPT2LMHeadModel to ~4e-15): logits, loss, every parameter's gradient
// and 5 AdamW steps, tied with biases (OpenAI's layout) and untied without q/k/v bias (the seed's).
// Then what the fixtures cannot see: finite differences through dropout, dropout's keying, cached
// decoding, initialisation, and errors.
#include <cmath>

#include "core/allocator.h"
#include "core/parallel.h"
#include "generate/generate.h"
#include "models/gpt2/model.h"
#include "models/model_config.h"
#include "support/model_fixture.h"
#include "support/op_test.h"
#include "train/optimizer.h"

using namespace loom;

namespace {

const test::Fixture& fixture() {
  static test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/gpt2_lm.json");
  return f;
}

gpt2::Config config_of(const std::string& variant) {
  return test::family_config_from_fixture<gpt2::Config>(fixture(), variant, "gpt2");
}

std::unique_ptr<gpt2::GPT2> fixture_model(const std::string& variant) {
  return test::load_fixture_parameters(std::make_unique<gpt2::GPT2>(config_of(variant), 0), fixture(), variant);
}

class Gpt2Fixture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Gpt2Fixture, ParametersAreTheFixturesNamesAndShapes) {
  const std::string v = GetParam();
  gpt2::GPT2 model(config_of(v), 0);
  const int64_t total = test::expect_fixture_parameters(model, fixture(), v);
  EXPECT_EQ(total, model.config().total_params());
  EXPECT_EQ(total, models::ModelConfig::from_json(model.config().to_json()).stats().total_params);
  EXPECT_EQ(model.parameter("position_embeddings.weight").group, nn::ParamGroup::Position);
  EXPECT_EQ(model.parameter("layers.0.mlp.proj.weight").group, nn::ParamGroup::DenseOut);
  EXPECT_EQ(model.parameter("layers.0.mlp.fc.bias").group, nn::ParamGroup::Bias);
  EXPECT_EQ(model.parameter("layers.1.ln2.bias").group, nn::ParamGroup::Norm);
}

TEST_P(Gpt2Fixture, LogitsLossAndEveryGradientMatchPyTorch) {
  const std::string v = GetParam();
  auto model = fixture_model(v);
  Tensor ids = fixture().get(v + ".ids"), targets = fixture().get(v + ".targets");
  test::expect_close(model->logits(ids), fixture().get(v + ".logits"), 2e-5f, 1e-4f, "logits");
  Tensor loss = model->loss(ids, targets);
  EXPECT_NEAR(loss.item(), fixture().get(v + ".loss").item(), 1e-5);
  loss.backward();
  for (nn::Parameter* p : model->parameters()) {
    // k_proj's bias has no effect on the loss (it shifts every score of a softmax row alike): PyTorch's
    // float64 gradient is ~1e-17, ours is f32 rounding of zero.
    test::expect_close(p->value.grad(), fixture().get(v + ".grad." + p->name), 2e-5f, 1e-3f, "grad of " + p->name);
  }
}

TEST_P(Gpt2Fixture, FiveAdamWStepsMatchTorchOptimAdamW) {
  const std::string v = GetParam();
  auto model = fixture_model(v);
  train::AdamW opt(model->parameters(), {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
  auto expected = fixture().get(v + ".adamw.losses").to_vector<float>();
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    Tensor loss = model->loss(fixture().get(v + ".adamw.ids." + std::to_string(step)),
                              fixture().get(v + ".adamw.targets." + std::to_string(step)));
    EXPECT_NEAR(loss.item(), expected[static_cast<size_t>(step)], 1e-4) << "step " << step;
    loss.backward();
    opt.step();
  }
  for (nn::Parameter* p : model->parameters()) {
    if (p->name.ends_with("attn.k_proj.bias")) {
      // Its gradient is zero up to rounding (it shifts a softmax row uniformly), and Adam divides the
      // rounding noise by its own size: each side's update is +-lr of noise. Only the bound holds.
      auto now = p->value.to_vector<float>(), init = fixture().get(v + ".init." + p->name).to_vector<float>();
      for (size_t i = 0; i < now.size(); ++i) EXPECT_LE(std::fabs(now[i] - init[i]), 5 * 3e-3f + 1e-3f) << p->name;
      continue;
    }
    test::expect_close(p->value, fixture().get(v + ".adamw.final." + p->name), 1e-5f, 1e-4f, "after 5 steps: " + p->name);
  }
}

TEST_P(Gpt2Fixture, GradientClippingMatchesTorch) {
  const std::string v = GetParam();
  auto model = fixture_model(v);
  model->loss(fixture().get(v + ".ids"), fixture().get(v + ".targets")).backward();
  auto grads = train::gradients_of(model->parameters());
  double norm = train::clip_grad_norm(grads, 0.5);
  EXPECT_NEAR(norm, fixture().get(v + ".clip.norm").item(), 1e-4 * norm);
  test::expect_close(model->parameter("token_embeddings.weight").value.grad(),
                     fixture().get(v + ".clip.token_embeddings.weight"), 1e-6f, 1e-4f, "clipped embedding grad");
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, Gpt2Fixture, ::testing::Values("tied", "untied"));

namespace {
gpt2::Config tiny(float dropout = 0.0f) {
  return {.vocab_size = 23, .context_length = 10, .d_model = 8, .num_layers = 2, .num_heads = 2, .d_ff = 12,
      .dropout = dropout};
}
}  // namespace

// Every parameter's gradient against central differences, with dropout on: a fixed key makes the masks
// part of the function.
TEST(Gpt2, GradcheckWithDropout) {
  gpt2::GPT2 model(tiny(0.2f), 3);
  for (nn::Parameter* p : model.parameters()) {  // away from init: non-trivial biases and gains
    Tensor r = test::randn(p->value.shape(), std::hash<std::string>{}(p->name) % 1000, 0.3f);
    p->value.copy_from(r);
  }
  Tensor ids = Tensor::from_vector<int32_t>({2, 5}, {1, 4, 9, 22, 0, 7, 7, 3, 11, 5});
  Tensor targets = Tensor::from_vector<int32_t>({2, 5}, {4, 9, 22, 0, 1, 7, 3, 11, 5, 2});
  const auto ctx = models::ForwardContext::train(RngKey::from_seed(5));
  TensorList params;
  for (nn::Parameter* p : model.parameters()) params.push_back(p->value);
  test::gradcheck([&](const TensorList&) { return model.loss(ids, targets, ctx); }, params, 1e-2f, 3e-3f, 3e-2f, 6);
}

TEST(Gpt2, DropoutIsKeyedOffInEvalAndIndependentOfThreads) {
  gpt2::GPT2 model(tiny(0.3f), 4);
  gpt2::GPT2 no_dropout(tiny(0.0f), 4);
  Tensor ids = Tensor::from_vector<int32_t>({1, 6}, {1, 2, 3, 4, 5, 6});
  Tensor targets = Tensor::from_vector<int32_t>({1, 6}, {2, 3, 4, 5, 6, 7});
  autograd::NoGradGuard no_grad;
  const float eval = model.loss(ids, targets).item();
  EXPECT_EQ(eval, no_dropout.loss(ids, targets).item()) << "evaluation must not drop";
  const auto k1 = models::ForwardContext::train(RngKey::from_seed(1));
  const auto k2 = models::ForwardContext::train(RngKey::from_seed(2));
  set_num_threads(1);
  const float one_thread = model.loss(ids, targets, k1).item();
  set_num_threads(2);
  EXPECT_EQ(model.loss(ids, targets, k1).item(), one_thread) << "same key, other thread count";
  EXPECT_NE(model.loss(ids, targets, k2).item(), one_thread) << "another key, other masks";
  EXPECT_NE(one_thread, eval);
  // Training without dropout is the evaluation function.
  EXPECT_EQ(no_dropout.loss(ids, targets, k1).item(), eval);
}

TEST(Gpt2, CachedDecodingGivesTheLogitsOfTheFullForward) {
  for (bool tied : {true, false}) {
    gpt2::Config c = tiny();
    c.tie_embeddings = tied;
    c.qkv_bias = tied;
    gpt2::GPT2 model(c, 11);
    std::vector<int32_t> tokens{3, 17, 20, 0, 9, 9, 15, 1, 18, 7};
    Tensor full = model.logits(Tensor::from_vector<int32_t>({1, 10}, tokens));
    auto cache = model.make_decode_cache(1);
    Tensor prefill = model.decode(Tensor::from_vector<int32_t>({1, 4}, {tokens.begin(), tokens.begin() + 4}), *cache);
    std::vector<float> cached = prefill.to_vector<float>();
    for (size_t i = 4; i < tokens.size(); ++i) {
      auto step = model.decode(Tensor::from_vector<int32_t>({1, 1}, {tokens[i]}), *cache).to_vector<float>();
      cached.insert(cached.end(), step.begin(), step.end());
    }
    test::expect_close(Tensor::from_vector<float>({1, 10, 23}, cached), full, 1e-5f, 1e-5f, "cached logits");
    EXPECT_EQ(cache->length(), 10);
    EXPECT_THROW(model.decode(Tensor::zeros({1, 1}, DType::I32), *cache), Error);  // position 10 is past the table
  }
}

TEST(Gpt2, GreedyGenerationEqualsArgmaxOfTheFullForward) {
  gpt2::GPT2 model(tiny(), 9);
  std::vector<int32_t> seq{5, 1, 12};
  generate::GenerateOptions o;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0;
  auto out = generate::generate(model, seq, o);
  for (int32_t next : out) {
    Tensor logits = model.logits(Tensor::from_vector<int32_t>({1, static_cast<int64_t>(seq.size())}, seq));
    auto v = logits.to_vector<float>();
    const float* last = v.data() + (seq.size() - 1) * 23;
    EXPECT_EQ(next, static_cast<int32_t>(std::max_element(last, last + 23) - last));
    seq.push_back(next);
  }
}

TEST(Gpt2, InitialisationIsGpt2s) {
  gpt2::Config c = tiny();
  c.d_model = 64;
  c.num_heads = 4;
  c.num_layers = 8;
  c.d_ff = 0;
  gpt2::GPT2 model(c, 1);
  auto stats = [&](const std::string& name) {
    auto v = model.parameter(name).value.to_vector<float>();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double n = static_cast<double>(v.size()), mean = s / n;
    return std::pair<double, double>(mean, std::sqrt(s2 / n - mean * mean));
  };
  EXPECT_NEAR(stats("layers.0.mlp.fc.weight").second, 0.02, 0.002);
  EXPECT_NEAR(stats("layers.3.attn.q_proj.weight").second, 0.02, 0.002);
  EXPECT_NEAR(stats("layers.0.mlp.proj.weight").second, 0.02 / std::sqrt(16.0), 0.0006);
  EXPECT_NEAR(stats("layers.5.attn.output_proj.weight").second, 0.02 / std::sqrt(16.0), 0.0008);
  EXPECT_EQ(stats("layers.0.attn.q_proj.bias"), std::make_pair(0.0, 0.0));
  EXPECT_EQ(stats("layers.0.ln1.weight").first, 1.0);
  EXPECT_EQ(model.parameter("layers.0.mlp.fc.weight").value.size(0), 256);  // d_ff 0 = 4 * d_model
  EXPECT_THROW(model.parameter("lm_head.weight"), Error);  // tied
}

TEST(Gpt2, ImpossibleShapesAreRefusedNamingTheValue) {
  gpt2::Config c = tiny();
  c.num_heads = 3;  // 8 % 3
  test::expect_error_mentions([&] { gpt2::GPT2 m(c, 0); }, {"model.d_model=8", "model.num_heads=3"});
  c = tiny(1.0f);
  test::expect_error_mentions([&] { gpt2::GPT2 m(c, 0); }, {"model.dropout", "1"});
  test::expect_error_mentions(
      [&] { models::ModelConfig::from_json({{"arch", "gpt2"}, {"d_ff", -1}}); }, {"model.d_ff", "-1"});
  test::expect_error_mentions(
      [&] { models::ModelConfig::from_json({{"arch", "gpt2"}, {"rope_theta", 1.0}}); }, {"unknown key model.rope_theta"});
  gpt2::GPT2 model(tiny(), 0);
  test::expect_error_mentions([&] { model.logits(Tensor::zeros({1, 11}, DType::I32)); }, {"context_length 10"});
  test::expect_error_mentions([&] { model.logits(Tensor::from_vector<int32_t>({1, 2}, {3, 23})); }, {"23"});
}
