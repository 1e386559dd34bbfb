// The model families on a GPU against the same models on the CPU: every parameter copied to cuda:0, the
// loss and every parameter's gradient, then a few AdamW steps whose losses must track the CPU run's.
// Skipped without a GPU; tools/device_check.sh runs it. A failure here while the op tests pass points
// at a CPU-only op or a host read left in a model's forward (docs/cuda.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "gpu_test.h"
#include "models/deepseek_v3/model.h"
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
  if (arch == "deepseek_v3") {
    // configs/dsv3-tiny.json's shape on this vocabulary: MLA, 1 dense + 1 MoE layer (a shared expert and
    // 4 routed, top 2), one MTP module; a balance-loss weight large enough to reach the router's gradient.
    j = {{"arch", arch},      {"vocab_size", 96}, {"context_length", 32}, {"d_model", 32}, {"num_layers", 2},
         {"num_heads", 2},    {"q_rank", 16},     {"kv_rank", 8},         {"d_nope", 8},   {"d_rope", 4},
         {"d_v", 8},          {"d_ff", 64},       {"n_routed", 4},        {"top_k", 2},    {"d_expert", 16},
         {"alpha_seq", 0.01}, {"n_mtp", 1}};
  }
  return models::ModelConfig::from_json(j).build(7);
}

// DeepSeek-V3's routing biases (model state, not parameters) moved to the GPU with the parameters.
void move_state(models::LanguageModel& model, Device device) {
  if (auto* dsv3 = dynamic_cast<deepseek_v3::DeepSeekV3*>(&model)) {
    for (deepseek_v3::MoE* m : dsv3->moe_layers()) m->bias = m->bias.to(device);
  }
}

std::vector<float> routing_biases(const models::LanguageModel& model) {
  std::vector<float> out;
  for (const auto& [name, t] : model.state_tensors()) {
    for (float v : host_values(t)) out.push_back(v);
  }
  return out;
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
  move_state(*gpu_model, kGpu);
  // DeepSeek-V3 trains through its training forward (the MTP module and the balance loss, the expert
  // loads recorded) and moves its routing biases after each step; the others' evaluation forward is
  // their training forward without dropout.
  const bool dsv3 = GetParam() == "deepseek_v3";
  const models::ForwardContext ctx = dsv3 ? models::ForwardContext::train(RngKey::from_seed(5)) : models::ForwardContext{};
  train::AdamW cpu_opt(cpu_model->parameters(), {}), gpu_opt(gpu_model->parameters(), {});
  for (int step = 0; step < 4; ++step) {
    Tensor ids = random_tokens(2, 24, 96, 200 + step), targets = random_tokens(2, 24, 96, 300 + step);
    cpu_model->begin_training_step();
    gpu_model->begin_training_step();
    Tensor lc = cpu_model->loss(ids, targets, ctx), lg = gpu_model->loss(ids.to(kGpu), targets.to(kGpu), ctx);
    ASSERT_TRUE(lg.device().is_cuda()) << GetParam();
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
    cpu_model->end_training_step(true);
    gpu_model->end_training_step(true);
    // The biases move by +-gamma on integer load comparisons: the same expert choices give the same bits.
    EXPECT_EQ(routing_biases(*gpu_model), routing_biases(*cpu_model)) << GetParam() << " step " << step;
  }
  if (dsv3) {
    const nlohmann::json mc = cpu_model->take_training_metrics(), mg = gpu_model->take_training_metrics();
    EXPECT_EQ(mg["expert_load_min"], mc["expert_load_min"]);
    EXPECT_EQ(mg["expert_load_max"], mc["expert_load_max"]);
    EXPECT_NEAR(mg["mtp_loss"].get<double>(), mc["mtp_loss"].get<double>(), 1e-4 * std::abs(mc["mtp_loss"].get<double>()));
    EXPECT_NEAR(mg["balance_loss"].get<double>(), mc["balance_loss"].get<double>(),
                1e-4 * std::abs(mc["balance_loss"].get<double>()));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaModel, testing::Values("llama", "gpt2", "deepseek_v3"),
                         [](const auto& info) { return info.param; });
