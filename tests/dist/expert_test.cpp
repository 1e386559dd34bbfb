// DeepSeek-V3 on the mesh: 20 AdamW steps (clipping on, aux-loss-free bias updates on) of a dsv3-tiny
// model in every mode (dp, fsdp, tp, fsdp_tp, and expert parallelism: dp_ep with expert=2 and 4, data x
// expert, fsdp_ep) with the in-process communicator, against one process on the same global batches:
// losses within 1e-5 relative, every parameter within 1e-5, the routing biases bitwise equal after every
// step, the same expert load shares. Also a batch routed almost entirely to one expert rank, the cap on
// received rows, the all-to-all itself and its gradient, and the mesh's expert axis.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "core/parallel.h"
#include "dist/runtime.h"
#include "models/deepseek_v3/model.h"
#include "ops/collective.h"
#include "ops/elementwise.h"
#include "train/optimizer.h"
#include "support/synthetic_batch.h"

using namespace loom;
using dist::Mesh;
using dist::ParallelMode;

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 8, kSeq = 16, kVocab = 512;
constexpr double kClip = 0.5;

// configs/dsv3-tiny.json's model: 2 layers (1 dense + 1 MoE of 4 routed experts, top 2, 1 shared), MLA
// with 2 heads, one MTP module.
deepseek_v3::Config tiny() {
  deepseek_v3::Config c;
  c.vocab_size = kVocab;
  c.context_length = 32;
  c.d_model = 32;
  c.num_layers = 2;
  c.n_dense = 1;
  c.num_heads = 2;
  c.q_rank = 16;
  c.kv_rank = 8;
  c.d_nope = 8;
  c.d_rope = 4;
  c.d_v = 8;
  c.d_ff = 64;
  c.n_shared = 1;
  c.n_routed = 4;
  c.top_k = 2;
  c.d_expert = 16;
  c.gamma = 1e-3f;
  c.alpha_seq = 1e-4f;
  c.n_mtp = 1;
  return c;
}

std::pair<Tensor, Tensor> batch_of(int step) { return loom::test::synthetic_batch(step, kBatch, kSeq, kVocab); }

// lr 5e-4: one embedding entry (token 481, column 10) gets a gradient that is mostly rounding noise,
// which AdamW normalises into lr-sized steps in any implementation; its drift is proportional to lr
// (8.4e-6 at 1e-3 under dp, 1.7e-5 under dp_ep, half that at 5e-4). Every other entry agrees to 2e-6.
train::AdamWOptions adamw() { return {5e-4f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> biases;        // after every step, the MoE layer's routing bias
  std::vector<double> load_min, load_max;        // per step: the least and most loaded expert's share
  std::map<std::string, std::vector<float>> params;
};

// skew: start with the routing biases of experts 0 and 1 far above the others, so that every token picks
// them (both live on expert rank 0 when expert = 2; with expert = 4 they are ranks 0 and 1).
std::unique_ptr<deepseek_v3::DeepSeekV3> build(bool skew) {
  auto m = std::make_unique<deepseek_v3::DeepSeekV3>(tiny(), 11);
  if (skew) m->load_state("layers.1.moe.bias", Tensor::from_vector<float>({4}, {1.0f, 0.9f, 0.0f, 0.0f}));
  return m;
}

void one_step(deepseek_v3::DeepSeekV3& model, int s, const dist::RankContext* ctx, train::AdamW& opt,
              const std::vector<dist::TensorLayout>& layout, TrainRun& run, bool record) {
  auto params = model.parameters();
  model.begin_training_step();
  opt.zero_grad();
  auto [ids, targets] = batch_of(s);
  if (ctx) {
    ids = dist::local_batch(ids, *ctx);
    targets = dist::local_batch(targets, *ctx);
  }
  Tensor loss = model.loss(ids, targets, models::ForwardContext::train(RngKey::from_seed(1)));
  const double global = ctx ? dist::global_loss(loss.item(), *ctx) : loss.item();
  loss.backward();
  double norm;
  if (ctx) {
    dist::finish_gradients(params, *ctx);
    norm = dist::clip_grad_norm(params, layout, *ctx, kClip);
  } else {
    norm = train::clip_grad_norm(train::gradients_of(params), kClip);
  }
  opt.step();
  model.end_training_step(true);
  const nlohmann::json m = model.take_training_metrics();
  if (record) {
    run.losses.push_back(global);
    run.norms.push_back(norm);
    run.biases.push_back(model.moe_layers()[0]->bias.to_vector<float>());
    run.load_min.push_back(m.at("expert_load_min")[0].get<double>());
    run.load_max.push_back(m.at("expert_load_max")[0].get<double>());
  }
}

TrainRun train_single(bool skew) {
  TrainRun run;
  auto model = build(skew);
  train::AdamW opt(model->parameters(), adamw());
  for (int s = 0; s < kSteps; ++s) one_step(*model, s, nullptr, opt, {}, run, true);
  for (nn::Parameter* p : model->parameters()) run.params[p->name] = p->value.to_vector<float>();
  return run;
}

TrainRun train_sharded(const Mesh& mesh, ParallelMode mode, bool skew, int64_t* all_to_all_bytes = nullptr) {
  TrainRun run;
  std::vector<std::vector<std::vector<float>>> rank_biases(static_cast<size_t>(mesh.size()));
  dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, mode, &comm, rank});
    auto model = build(skew);
    auto layout = dist::shard_model(*model, ctx);
    train::AdamW opt(model->parameters(), adamw());
    // Under the expert modes each rank holds n_routed / expert experts, and so does its AdamW state.
    const nn::Parameter& w1 = model->parameter("layers.1.moe.experts.w1");
    EXPECT_EQ(w1.value.size(0), dist::is_expert_mode(mode) ? 4 / mesh.expert : 4);
    TrainRun mine;
    for (int s = 0; s < kSteps; ++s) one_step(*model, s, ctx.get(), opt, layout, mine, true);
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i]->name == w1.name) {
        EXPECT_EQ(opt.exp_avg(i).shape(), w1.value.shape());
      }
    }
    rank_biases[static_cast<size_t>(rank)] = mine.biases;
    for (nn::Parameter* p : model->parameters()) {
      Tensor whole = dist::gather_whole(p->value, *p, *ctx);
      if (rank == 0) run.params[p->name] = whole.to_vector<float>();
    }
    if (rank == 0) {
      run.losses = mine.losses;
      run.norms = mine.norms;
      run.biases = mine.biases;
      run.load_min = mine.load_min;
      run.load_max = mine.load_max;
      if (all_to_all_bytes) *all_to_all_bytes = comm.stats.all_to_all_bytes;
    }
  });
  // Every rank holds the same biases (model state is never sharded).
  for (const auto& b : rank_biases) EXPECT_EQ(b, run.biases);
  return run;
}

void expect_equivalent(const TrainRun& ref, const TrainRun& got) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "loss at step " << s + 1;
    EXPECT_NEAR(got.norms[s], ref.norms[s], 1e-4 * ref.norms[s]) << "grad norm at step " << s + 1;
    EXPECT_EQ(got.biases[s], ref.biases[s]) << "routing bias after step " << s + 1;
    EXPECT_EQ(got.load_min[s], ref.load_min[s]) << "least expert load at step " << s + 1;
    EXPECT_EQ(got.load_max[s], ref.load_max[s]) << "most expert load at step " << s + 1;
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (const auto& [name, values] : ref.params) {
    const auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    float worst = 0;
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(it->second[i] - values[i]));
    EXPECT_LE(worst, 1e-5f) << name;
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class DeepSeekOnMesh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }
};

}  // namespace

TEST_F(DeepSeekOnMesh, EveryModeMatchesOneProcess) {
  const TrainRun ref = train_single(false);
  // The run must exercise clipping, learning and balancing: some step clipped, the loss went down, and
  // the biases moved (every bias update changes which experts some tokens pick).
  EXPECT_TRUE(std::any_of(ref.norms.begin(), ref.norms.end(), [](double n) { return n > kClip; }));
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  EXPECT_NE(ref.biases.back(), std::vector<float>(4, 0.0f));
  const std::vector<std::pair<Mesh, ParallelMode>> cases = {
      {{2, 1, 1}, ParallelMode::Dp},     {{4, 1, 1}, ParallelMode::Fsdp},   {{1, 2, 1}, ParallelMode::Tp},
      {{2, 2, 1}, ParallelMode::FsdpTp}, {{1, 1, 2}, ParallelMode::DpEp},   {{1, 1, 4}, ParallelMode::DpEp},
      {{2, 1, 2}, ParallelMode::DpEp},   {{2, 1, 2}, ParallelMode::FsdpEp},
  };
  for (const auto& [mesh, mode] : cases) {
    SCOPED_TRACE(std::string(dist::parallel_mode_name(mode)) + " on " + mesh.str());
    expect_equivalent(ref, train_sharded(mesh, mode, false));
  }
}

TEST_F(DeepSeekOnMesh, SkewedRoutingMatchesOneProcess) {
  const TrainRun ref = train_single(true);
  // Experts 0 and 1 take (nearly) every slot: with expert = 2 one rank computes almost all of them.
  EXPECT_GE(ref.load_max.front(), 0.45);
  EXPECT_LE(ref.load_min.front(), 0.05);
  for (const Mesh& mesh : {Mesh{1, 1, 2}, Mesh{1, 1, 4}}) {
    SCOPED_TRACE("dp_ep on " + mesh.str());
    int64_t bytes = 0;
    expect_equivalent(ref, train_sharded(mesh, ParallelMode::DpEp, true, &bytes));
    EXPECT_GT(bytes, 0);
  }
}

TEST_F(DeepSeekOnMesh, ReceivedRowsOverTheCapAreAClearError) {
  const Mesh mesh{1, 1, 2};
  const std::string e = error_of([&] {
    dist::run_in_process(2, [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, ParallelMode::DpEp, &comm, rank});
      ctx->max_expert_rows = 40;
      auto model = build(true);  // every token picks experts 0 and 1, both on expert rank 0
      dist::shard_model(*model, ctx);
      auto [ids, targets] = batch_of(0);
      model->loss(dist::local_batch(ids, *ctx), dist::local_batch(targets, *ctx));
    });
  });
  // Rank 0 receives both slots of all 2 x 4 x 16 tokens: 256 rows, 128 from each member.
  EXPECT_NE(e.find("rank 0 would receive 256 token rows"), std::string::npos) << e;
  EXPECT_NE(e.find("128, 128"), std::string::npos) << e;
  EXPECT_NE(e.find("cap of 40"), std::string::npos) << e;
}

TEST_F(DeepSeekOnMesh, AllToAllMovesRowsAndItsGradientGoesBack) {
  dist::run_in_process(3, [&](int rank, dist::Communicator& comm) {
    const dist::Group group{&comm, {0, 1, 2}};
    // Rank r sends (r + i) rows to member i; row j of the block for i holds 100 r + 10 i + j (width 2).
    std::vector<int64_t> send(3);
    std::vector<float> values;
    for (int i = 0; i < 3; ++i) {
      send[static_cast<size_t>(i)] = rank + i;
      for (int j = 0; j < rank + i; ++j) {
        values.push_back(static_cast<float>(100 * rank + 10 * i + j));
        values.push_back(-1.0f);
      }
    }
    const std::vector<int64_t> recv = ops::exchange_counts(send, group);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(recv[static_cast<size_t>(i)], i + rank);
    Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(values.size() / 2), 2}, values);
    x.set_requires_grad();
    Tensor y = ops::all_to_all(x, send, recv, group);
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < i + rank; ++j, ++row) EXPECT_EQ(y.data<float>()[row * 2], 100 * i + 10 * rank + j);
    }
    EXPECT_EQ(row, y.size(0));
    // d(sum of y * w)/dx with w = the value itself: x's gradient is x, returned to its sender.
    Tensor w = y.detach().clone();
    ops::sum(ops::mul(y, w)).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), values);
  });
}

TEST(ExpertMesh, AxisLayoutAndValidation) {
  const Mesh m = Mesh::parse("data=2,expert=4");
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.str(), "data=2,tensor=1,expert=4");
  EXPECT_EQ(Mesh::parse(m.str()).expert, 4);
  // rank = d * expert + e (tensor = 1): an expert group is a run of neighbouring ranks.
  EXPECT_EQ(m.group(5, dist::MeshAxis::Expert), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(5, dist::MeshAxis::Data), (std::vector<int>{1, 5}));
  EXPECT_EQ(dist::batch_slices(m, ParallelMode::DpEp), 8);
  EXPECT_NO_THROW(dist::validate_mesh_for_mode(m, ParallelMode::DpEp));
  EXPECT_NO_THROW(dist::validate_mesh_for_mode(m, ParallelMode::FsdpEp));
  EXPECT_NE(error_of([&] { dist::validate_mesh_for_mode(m, ParallelMode::Dp); }).find("needs expert=1"), std::string::npos);
  EXPECT_NE(error_of([] { dist::validate_mesh_for_mode({2, 1, 1}, ParallelMode::DpEp); }).find("expert > 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { dist::validate_experts_for_mesh(4, {1, 1, 3}, ParallelMode::DpEp); }).find("model.n_routed=4"),
            std::string::npos);
  EXPECT_NE(error_of([] { dist::validate_batch_for_mesh(6, {2, 1, 2}, ParallelMode::DpEp); }).find("data x expert"),
            std::string::npos);
  EXPECT_EQ(dist::parallel_mode_from_name("fsdp_ep"), ParallelMode::FsdpEp);
  // The experts' specs: dim 0 over expert, fsdp_ep adds data on d_model.
  EXPECT_EQ(dist::spec_for(nn::ParamGroup::ExpertIn, ParallelMode::DpEp, 3).str(), "(expert, None, None)");
  EXPECT_EQ(dist::spec_for(nn::ParamGroup::ExpertIn, ParallelMode::FsdpEp, 3).str(), "(expert, None, data)");
  EXPECT_EQ(dist::spec_for(nn::ParamGroup::ExpertOut, ParallelMode::FsdpTp, 3).str(), "(None, data, tensor)");
  EXPECT_EQ(dist::spec_for(nn::ParamGroup::DenseInWhole, ParallelMode::Tp, 2).str(), "(None, None)");
}

// docs/mesh.md's DeepSeek-V3 table, parameter by parameter, as shard_model assigns it.
TEST(ExpertMesh, DeepSeekSpecsFollowTheTable) {
  const std::vector<std::tuple<std::string, ParallelMode, Mesh, std::string>> cases = {
      {"layers.0.attn.wq_a.weight", ParallelMode::Tp, {1, 2, 1}, "(None, None)"},
      {"layers.0.attn.wkv_a.weight", ParallelMode::FsdpTp, {2, 2, 1}, "(None, data)"},
      {"layers.0.attn.wq_b.weight", ParallelMode::Tp, {1, 2, 1}, "(tensor, None)"},
      {"layers.0.attn.wkv_b.weight", ParallelMode::FsdpTp, {2, 2, 1}, "(tensor, data)"},
      {"layers.0.attn.wo.weight", ParallelMode::Tp, {1, 2, 1}, "(None, tensor)"},
      {"layers.0.attn.q_norm.weight", ParallelMode::FsdpTp, {2, 2, 1}, "(None)"},
      {"layers.1.moe.router.weight", ParallelMode::Tp, {1, 2, 1}, "(None, None)"},
      {"layers.1.moe.shared.w1.weight", ParallelMode::Tp, {1, 2, 1}, "(tensor, None)"},
      {"layers.1.moe.shared.w2.weight", ParallelMode::Fsdp, {2, 1, 1}, "(data, None)"},
      {"layers.1.moe.experts.w1", ParallelMode::Tp, {1, 2, 1}, "(None, tensor, None)"},
      {"layers.1.moe.experts.w2", ParallelMode::FsdpTp, {2, 2, 1}, "(None, data, tensor)"},
      {"layers.1.moe.experts.w3", ParallelMode::DpEp, {1, 1, 2}, "(expert, None, None)"},
      {"layers.1.moe.experts.w2", ParallelMode::FsdpEp, {2, 1, 2}, "(expert, data, None)"},
      {"layers.1.moe.router.weight", ParallelMode::DpEp, {1, 1, 2}, "(None, None)"},
      {"mtp.0.proj.weight", ParallelMode::Tp, {1, 2, 1}, "(None, None)"},
      {"lm_head.weight", ParallelMode::Tp, {1, 2, 1}, "(None, tensor)"},
  };
  for (const auto& [name, mode, mesh, spec] : cases) {
    deepseek_v3::DeepSeekV3 model(tiny(), 1);
    std::vector<nn::Parameter*> params = model.parameters();
    const auto layout = dist::plan_layout(dist::param_infos(params), mesh, mode);
    bool found = false;
    for (const dist::TensorLayout& l : layout) {
      if (l.name != name) continue;
      found = true;
      EXPECT_EQ(l.spec.str(), spec) << name << " under " << dist::parallel_mode_name(mode);
    }
    EXPECT_TRUE(found) << name;
  }
  // State is not a parameter: the biases are never in the layout.
  deepseek_v3::DeepSeekV3 model(tiny(), 1);
  for (const dist::TensorLayout& l : dist::plan_layout(dist::param_infos(model.parameters()), {1, 1, 2}, ParallelMode::DpEp)) {
    EXPECT_EQ(l.name.find(".moe.bias"), std::string::npos);
  }
}
