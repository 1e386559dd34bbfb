// The model families on a GPU against the same models on the CPU: every parameter copied to cuda:0, the
// loss and every parameter's gradient, then a few AdamW steps whose losses must track the CPU run's.
// Skipped without a GPU; tools/device_check.sh runs it. A failure here while the op tests pass points
// at a CPU-only op or a host read left in a model's forward (docs/cuda.md).
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "gpu_test.h"
#include "models/model.h"
#include "models/model_config.h"
#include "train/optimizer.h"

using namespace loom;
using namespace loom::test;

namespace {

std::unique_ptr<models::LanguageModel> tiny(const std::string& arch) {
  nlohmann::json j = {{"arch", arch}, {"vocab_size", 96}, {"context_length", 32}, {"d_model", 64},
                      {"num_layers", 2},  {"num_heads", 4},    {"d_ff", 128}};
  if (arch == "llama") j["num_kv_heads"] = 2;  // grouped-query attention
  return models::ModelConfig::from_json(j).build(7);
}

Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(seed), uint64_t(i)) % uint64_t(V));
  }
  return t;
}

class CudaModel : public testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CudaModel, LossGradientsAndTrainingStepsTrackTheCpu) {
  LOOM_REQUIRE_GPU();
  auto cpu_model = tiny(GetParam()), gpu_model = tiny(GetParam());
  for (nn::Parameter* p : gpu_model->parameters()) {
    p->value = p->value.to(kGpu);
    p->value.set_requires_grad();
  }
  train::AdamW cpu_opt(cpu_model->parameters(), {}), gpu_opt(gpu_model->parameters(), {});
  for (int step = 0; step < 4; ++step) {
    Tensor ids = random_tokens(2, 24, 96, 200 + step), targets = random_tokens(2, 24, 96, 300 + step);
    Tensor lc = cpu_model->loss(ids, targets), lg = gpu_model->loss(ids.to(kGpu), targets.to(kGpu));
    const float loss_c = host_values(lc)[0], loss_g = host_values(lg)[0];
    EXPECT_NEAR(loss_g, loss_c, 1e-4 * std::abs(loss_c)) << GetParam() << " step " << step;
    lc.backward();
    lg.backward();
    if (step == 0) {
      auto pc = cpu_model->parameters(), pg = gpu_model->parameters();
      ASSERT_EQ(pc.size(), pg.size());
      // GPT-2's key biases have an exact gradient of 0 (softmax is shift-invariant per query), so both
      // runs hold rounding noise there: every gradient is measured against at least 1e-2 of the largest.
      double largest = 0;
      for (nn::Parameter* p : pc) largest = std::max(largest, norm_of(host_values(p->value.grad())));
      for (size_t i = 0; i < pc.size(); ++i) {
        ASSERT_TRUE(pg[i]->value.grad().defined()) << pg[i]->name;
        EXPECT_LT(relative_error_floored(host_values(pg[i]->value.grad()), host_values(pc[i]->value.grad()),
                                         1e-2 * largest), 1e-4)
            << GetParam() << " " << pc[i]->name;
      }
    }
    train::clip_grad_norm(train::gradients_of(cpu_model->parameters()), 1.0);
    train::clip_grad_norm(train::gradients_of(gpu_model->parameters()), 1.0);
    cpu_opt.step(3e-3f);
    gpu_opt.step(3e-3f);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaModel, testing::Values("llama", "gpt2"),
                         [](const auto& info) { return info.param; });
