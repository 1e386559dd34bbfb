// DeepSeek-V3 on the mesh: 20 AdamW steps (clipping on, aux-loss-free bias updates on) of a dsv3-tiny
// model in every mode (dp, fsdp, tp, fsdp_tp, and expert parallelism: dp_ep with expert=2 and 4, data x
// expert, fsdp_ep with data x expert, expert=2 and expert=4) with the in-process communicator, against one
// process on the same global batches: losses within 1e-5 relative, every parameter within 1e-5, the
// routing biases bitwise equal after every step, the same expert load shares. Also a batch routed almost
// entirely to one expert rank, the cap on received rows, the all-to-all itself and its gradient, the
// mesh's expert axis, and fsdp_ep's expert axis folded into data: each rank's share of the dense weights
// and their AdamW state, the layout, and the same bits with and without overlap.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "core/parallel.h"
#include "parallel/runtime.h"
#include "nn/sharded.h"
#include "models/deepseek_v3/model.h"
#include "ops/collective.h"
#include "ops/elementwise.h"
#include "train/optimizer.h"
#include "support/equivalence.h"
#include "support/op_test.h"
#include "support/synthetic_batch.h"

using namespace loom;
using dist::Mesh;
using dist::ParallelMode;
using test::error_of;

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 8, kSeq = 16, kVocab = 512;
constexpr double kClip = 0.5;

// configs/dsv3-tiny.json's model: 2 layers (1 dense + 1 MoE of 4 routed experts, top 2, 1 shared), MLA
// with 2 heads, one MTP module.
deepseek_v3::Config tiny() {
  return {.vocab_size = kVocab, .context_length = 32, .d_model = 32, .num_layers = 2, .n_dense = 1, .num_heads = 2,
      .q_rank = 16, .kv_rank = 8, .d_nope = 8, .d_rope = 4, .d_v = 8, .d_ff = 64, .n_shared = 1, .n_routed = 4,
      .top_k = 2, .d_expert = 16, .gamma = 1e-3f, .alpha_seq = 1e-4f, .n_mtp = 1};
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
  test::WholeParameters params;
  int64_t all_to_all_bytes = 0, started = 0;  // rank 0's: bytes it sent by all-to-all, collectives it started
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

// overlap: RankContext::overlap (FSDP prefetch and background reduce-scatters).
TrainRun train_sharded(const Mesh& mesh, ParallelMode mode, bool skew, bool overlap = true, int steps = kSteps) {
  TrainRun run;
  std::vector<std::vector<std::vector<float>>> rank_biases(static_cast<size_t>(mesh.size()));
  dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, mode, &comm, rank});
    ctx->overlap = overlap;
    auto model = build(skew);
    auto layout = dist::shard_model(*model, ctx);
    train::AdamW opt(model->parameters(), adamw());
    // Under the expert modes each rank holds n_routed / expert experts, and so does its AdamW state.
    const nn::Parameter& w1 = model->parameter("layers.1.moe.experts.w1");
    EXPECT_EQ(w1.value.size(0), dist::is_expert_mode(mode) ? 4 / mesh.expert : 4);
    TrainRun mine;
    for (int s = 0; s < steps; ++s) one_step(*model, s, ctx.get(), opt, layout, mine, true);
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i]->name == w1.name) {
        EXPECT_EQ(opt.exp_avg(i).shape(), w1.value.shape());
      }
    }
    rank_biases[static_cast<size_t>(rank)] = mine.biases;
    test::gather_parameters(model->parameters(), *ctx, run.params);
    if (rank == 0) {
      run.losses = mine.losses;
      run.norms = mine.norms;
      run.biases = mine.biases;
      run.load_min = mine.load_min;
      run.load_max = mine.load_max;
      run.all_to_all_bytes = comm.stats.all_to_all_bytes;
      run.started = comm.stats.started;
    }
  });
  // Every rank holds the same biases (model state is never sharded).
  for (const auto& b : rank_biases) EXPECT_EQ(b, run.biases);
  return run;
}

void expect_equivalent(const TrainRun& ref, const TrainRun& got) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    test::expect_step_near(s, got.losses[s], ref.losses[s], got.norms[s], ref.norms[s]);
    EXPECT_EQ(got.biases[s], ref.biases[s]) << "routing bias after step " << s + 1;
    EXPECT_EQ(got.load_min[s], ref.load_min[s]) << "least expert load at step " << s + 1;
    EXPECT_EQ(got.load_max[s], ref.load_max[s]) << "most expert load at step " << s + 1;
  }
  test::expect_parameters_near(ref.params, got.params);
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
      {{2, 1, 2}, ParallelMode::DpEp},
      // fsdp_ep: the dense weights split over data x expert (the expert axis folded into data), the
      // experts over expert and data; with data = 1 the dense weights are split over expert alone.
      {{2, 1, 2}, ParallelMode::FsdpEp}, {{1, 1, 2}, ParallelMode::FsdpEp}, {{1, 1, 4}, ParallelMode::FsdpEp},
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
    const TrainRun got = train_sharded(mesh, ParallelMode::DpEp, true);
    expect_equivalent(ref, got);
    EXPECT_GT(got.all_to_all_bytes, 0);
  }
}

// fsdp_ep folds the expert axis into data for everything FSDP shards (torchtitan's dp_shard): on a
// data x expert mesh every rank holds 1/(data x expert) of each dense weight (MLA, the shared expert, the
// router, MTP's projection, the dense layer's MLP) and of its two AdamW moments, and, its experts being
// split over expert and then data, of the routed experts too. Only the norms and the embedding tables
// stay whole, as under fsdp. Measured on the tensors the ranks hold after a training step.
TEST_F(DeepSeekOnMesh, FsdpEpHoldsADataTimesExpertShareOfEveryDenseWeight) {
  auto is_dense = [](nn::ParamGroup g) {
    return g == nn::ParamGroup::DenseIn || g == nn::ParamGroup::DenseOut || g == nn::ParamGroup::DenseInWhole;
  };
  auto is_expert = [](nn::ParamGroup g) { return g == nn::ParamGroup::ExpertIn || g == nn::ParamGroup::ExpertOut; };
  std::map<std::string, int64_t> whole;  // bytes of each parameter on one process
  int64_t whole_dense = 0, whole_total = 0, whole_kept = 0;  // x3: with both moments; kept: whole on every rank
  const auto one_process = build(false);
  for (const nn::Parameter* p : one_process->parameters()) {
    const int64_t bytes = static_cast<int64_t>(p->value.nbytes());
    whole[p->name] = bytes;
    whole_total += 3 * bytes;
    if (is_dense(p->group)) whole_dense += 3 * bytes;
    if (!is_dense(p->group) && !is_expert(p->group)) whole_kept += 3 * bytes;
  }
  for (const Mesh& mesh : {Mesh{2, 1, 2}, Mesh{1, 1, 4}, Mesh{4, 1, 2}}) {
    SCOPED_TRACE("fsdp_ep on " + mesh.str());
    const int64_t slices = mesh.data * mesh.expert;
    std::vector<int64_t> dense(static_cast<size_t>(mesh.size())), total(dense.size());
    dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, ParallelMode::FsdpEp, &comm, rank});
      auto model = build(false);
      auto layout = dist::shard_model(*model, ctx);
      train::AdamW opt(model->parameters(), adamw());
      TrainRun unused;
      one_step(*model, 0, ctx.get(), opt, layout, unused, false);
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const nn::Parameter& p = *params[i];
        const int64_t bytes = static_cast<int64_t>(p.value.nbytes() + opt.exp_avg(i).nbytes() + opt.exp_avg_sq(i).nbytes());
        total[static_cast<size_t>(rank)] += bytes;
        if (is_dense(p.group)) {
          dense[static_cast<size_t>(rank)] += bytes;
          EXPECT_NE(p.spec.str().find("(data, expert)"), std::string::npos) << p.name << " " << p.spec.str();
        }
        if (is_dense(p.group) || is_expert(p.group)) {
          EXPECT_EQ(bytes * slices, 3 * whole.at(p.name)) << p.name << " on rank " << rank;
        } else {
          EXPECT_EQ(bytes, 3 * whole.at(p.name)) << p.name << " on rank " << rank;
        }
      }
    });
    for (size_t r = 0; r < dense.size(); ++r) {
      EXPECT_EQ(dense[r] * slices, whole_dense) << "rank " << r;
      EXPECT_EQ(total[r], whole_kept + (whole_total - whole_kept) / slices) << "rank " << r;
    }
    std::printf("fsdp_ep on %s: each rank holds %lld of %lld dense parameter+AdamW bytes, %lld of %lld in all\n",
                mesh.str().c_str(), static_cast<long long>(dense[0]), static_cast<long long>(whole_dense),
                static_cast<long long>(total[0]), static_cast<long long>(whole_total));
  }
}

// Overlap under fsdp_ep (FSDP prefetch and background reduce-scatters over the data x expert group, the
// all-to-alls blocking between them) changes when collectives run, never what they add: the same bits.
TEST_F(DeepSeekOnMesh, FsdpEpGivesTheSameBitsWithAndWithoutOverlap) {
  const TrainRun on = train_sharded({2, 1, 2}, ParallelMode::FsdpEp, false, true, 5);
  const TrainRun off = train_sharded({2, 1, 2}, ParallelMode::FsdpEp, false, false, 5);
  EXPECT_GT(on.started, 0) << "nothing was overlapped";
  EXPECT_EQ(off.started, 0);
  EXPECT_EQ(on.losses, off.losses);
  EXPECT_EQ(on.norms, off.norms);
  EXPECT_EQ(on.biases, off.biases);
  for (const auto& [name, values] : off.params) EXPECT_EQ(on.params.at(name), values) << name;
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
      // fsdp_ep: fsdp's specs with the expert axis folded into data for the dense groups.
      {"layers.0.attn.wq_a.weight", ParallelMode::FsdpEp, {2, 1, 2}, "(None, (data, expert))"},
      {"layers.0.attn.wq_b.weight", ParallelMode::FsdpEp, {2, 1, 2}, "(None, (data, expert))"},
      {"layers.0.attn.wo.weight", ParallelMode::FsdpEp, {2, 1, 2}, "((data, expert), None)"},
      {"layers.0.attn.kv_norm.weight", ParallelMode::FsdpEp, {2, 1, 2}, "(None)"},
      {"layers.1.moe.router.weight", ParallelMode::FsdpEp, {1, 1, 2}, "(None, (data, expert))"},
      {"layers.1.moe.shared.w2.weight", ParallelMode::FsdpEp, {2, 1, 2}, "((data, expert), None)"},
      {"layers.1.moe.experts.w1", ParallelMode::FsdpEp, {2, 1, 2}, "(expert, None, data)"},
      {"mtp.0.proj.weight", ParallelMode::FsdpEp, {2, 1, 2}, "(None, (data, expert))"},
      {"lm_head.weight", ParallelMode::FsdpEp, {2, 1, 2}, "(None, None)"},
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

// A dimension split over (data, expert) is cut into data x expert blocks, block d * expert + e on the rank
// with those coordinates; every tensor of dsv3-tiny under fsdp_ep is tiled by the ranks' blocks, each
// element held by exactly replication() ranks (1 for the dense weights and the experts).
TEST(ExpertMesh, FsdpEpFoldsTheExpertAxisIntoData) {
  using dist::MeshAxis;
  const Mesh m{2, 1, 4};
  const dist::DimSplit de = dist::DimSplit::folded({MeshAxis::Data, MeshAxis::Expert});
  EXPECT_EQ(de.str(), "(data, expert)");
  EXPECT_EQ(m.split_size(de), 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.split_coord(r, de), r);  // rank = d * expert + e
  EXPECT_EQ(m.split_group(5, de), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Folded the other way round the blocks run expert-major, and a gather's group follows them.
  const dist::DimSplit ed = dist::DimSplit::folded({MeshAxis::Expert, MeshAxis::Data});
  EXPECT_EQ(m.split_coord(1, ed), 2);
  EXPECT_EQ(m.split_group(0, ed), (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(dist::batch_spec(ParallelMode::FsdpEp).str(), "((data, expert), None)");
  EXPECT_EQ(dist::batch_spec(ParallelMode::DpEp).str(), "((data, expert), None)");
  const std::string e = error_of([&] {
    dist::shard_of("w", Shape({6, 4}), dist::PartitionSpec{{de, std::nullopt}}, Mesh{2, 1, 2}, 0);
  });
  EXPECT_NE(e.find("dimension 0 of size 6 does not divide by the (data, expert) axes (4 ranks)"), std::string::npos) << e;

  deepseek_v3::DeepSeekV3 model(tiny(), 1);
  for (const Mesh& mesh : {Mesh{2, 1, 2}, Mesh{1, 1, 4}, Mesh{4, 1, 2}}) {
    SCOPED_TRACE(mesh.str());
    for (const dist::TensorLayout& l : dist::plan_layout(dist::param_infos(model.parameters()), mesh, ParallelMode::FsdpEp)) {
      const Shape& g = l.global_shape;
      const bool dense = l.group == nn::ParamGroup::DenseIn || l.group == nn::ParamGroup::DenseOut ||
                         l.group == nn::ParamGroup::DenseInWhole;
      const bool experts = l.group == nn::ParamGroup::ExpertIn || l.group == nn::ParamGroup::ExpertOut;
      EXPECT_EQ(l.replication(), dense || experts ? 1 : mesh.size()) << l.name;
      std::vector<int> held(static_cast<size_t>(g.numel()), 0);
      for (const dist::Shard& s : l.shards) {
        for (int64_t i = 0; i < g.numel(); ++i) {
          bool inside = true;
          for (int d = g.ndim() - 1, rest = static_cast<int>(i); d >= 0; rest /= static_cast<int>(g[d]), --d) {
            const int64_t x = rest % g[d], o = s.offset[static_cast<size_t>(d)];
            inside = inside && x >= o && x < o + s.shape[d];
          }
          held[static_cast<size_t>(i)] += inside;
        }
      }
      EXPECT_EQ(held, std::vector<int>(held.size(), static_cast<int>(l.replication()))) << l.name;
      if (dense) {  // the folded dim's block index is the rank's place in the batch: d * expert + e
        const int dim = l.spec.dims[0] ? 0 : 1;
        for (const dist::Shard& s : l.shards) {
          EXPECT_EQ(s.offset[static_cast<size_t>(dim)], s.rank * s.shape[dim]) << l.name;
        }
      }
    }
  }
}
