// `loom plan` against loom itself: the parameter census equals the built model's parameters, group by
// group; each rank's parameter bytes equal its shards'; the bytes per collective of a step equal what
// the communicator counted (CommStats), for dp, fsdp, tp and fsdp_tp (Llama, GPT-2), fsdp (DeepSeek-V3:
// its MTP module a block of its own, its routed experts gathered alone), and the all-reduces and FSDP
// collectives of dp_ep and fsdp_ep (their all-to-alls depend on the routing), with and without
// recomputation.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/optimizer.h"
#include "ops/shape.h"
#include "parallel/pipeline.h"
#include "parallel/runtime.h"
#include "plan/plan.h"
#include "train/config.h"

using namespace loom;

namespace {

models::ModelConfig model_of(const std::string& preset, const std::vector<std::string>& overrides = {}) {
  return train::TrainConfig::load(preset, overrides).model;
}

plan::DeviceSpec fake_device() {
  plan::DeviceSpec d;
  d.name = "test";
  d.bf16_flops = d.f32_flops = 1e11;
  d.memory_bytes = 1e10;
  d.memory_bandwidth = 1e10;
  d.devices_per_node = 64;
  d.intra_node_bandwidth = d.inter_node_bandwidth = 1e9;
  return d;
}

Tensor ids_for(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(seed), static_cast<uint64_t>(i)) % V);
  }
  return t;
}

}  // namespace

TEST(Plan, CensusEqualsTheBuiltModel) {
  for (const auto& mc : {model_of("tiny"), model_of("gpt2-small", {"model.num_layers=2", "model.vocab_size=128"}),
                         model_of("gpt2-small-untied", {"model.num_layers=2", "model.vocab_size=128"}), model_of("dsv3-tiny"),
                         model_of("dsv3-tiny", {"model.n_shared=1", "model.n_mtp=1", "model.num_layers=3"})}) {
    std::map<dist::ParamGroup, double> built, counted;
    auto model = mc.build(1);
    for (nn::Parameter* p : model->parameters()) built[p->group] += static_cast<double>(p->value.numel());
    double total = 0;
    for (const plan::ParamCount& p : plan::census(mc)) {
      counted[p.group] += p.count;
      total += p.count;
    }
    EXPECT_EQ(built, counted) << mc.arch();
    EXPECT_EQ(total, static_cast<double>(mc.stats().total_params)) << mc.arch();
  }
}

// One training step as the trainer takes it (loss, backward, the loss and stop all-reduces, the
// gradient sums, the global norm), on in-process ranks; rank 0's CommStats per kind against the plan.
TEST(Plan, BytesPerCollectiveEqualLoomsCounts) {
  set_num_threads(1);
  struct Case {
    std::string preset;
    dist::Mesh mesh;
    dist::ParallelMode mode;
    models::Recompute recompute;
  };
  const std::vector<Case> cases = {
      {"tiny", {2, 1, 1}, dist::ParallelMode::Dp, models::Recompute::None},
      {"tiny", {4, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::None},
      {"tiny", {2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::Full},
      {"tiny", {1, 2, 1}, dist::ParallelMode::Tp, models::Recompute::None},
      {"tiny", {1, 2, 1}, dist::ParallelMode::Tp, models::Recompute::Selective},
      {"tiny", {2, 2, 1}, dist::ParallelMode::FsdpTp, models::Recompute::None},
      {"gpt2-small", {2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::None},
      {"dsv3-tiny", {1, 1, 2}, dist::ParallelMode::DpEp, models::Recompute::None},
      {"dsv3-tiny", {2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::None},
      {"dsv3-tiny", {2, 1, 2}, dist::ParallelMode::FsdpEp, models::Recompute::None},
      {"dsv3-tiny", {2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::Full},
  };
  for (const Case& c : cases) {
    const models::ModelConfig mc =
        c.preset == "gpt2-small"
            ? model_of("gpt2-small", {"model.vocab_size=128", "model.context_length=16", "model.d_model=32",
                                      "model.num_layers=2", "model.num_heads=4"})
            : model_of(c.preset, {"model.context_length=16"});
    const int64_t B = 8, T = 16;
    dist::CommStats measured;
    dist::run_in_process(static_cast<int>(c.mesh.size()), [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{c.mesh, c.mode, &comm, rank, true});
      auto model = mc.build(5);
      const auto layout = dist::shard_model(*model, ctx);
      auto params = model->parameters();
      for (int step = 0; step < 2; ++step) {
        const dist::CommStats before = comm.stats;
        Tensor ids = ids_for(B, T + 1, mc.vocab_size(), 7 + step);
        Tensor x = ops::narrow(ids, 1, 0, T), y = ops::narrow(ids, 1, 1, T);
        Tensor loss = model->loss(dist::local_batch(x, *ctx), dist::local_batch(y, *ctx),
                                  models::ForwardContext::train(RngKey::from_seed(1), c.recompute));
        dist::backward(loss, params, *ctx);
        dist::global_loss(static_cast<double>(loss.item()), *ctx);
        double any = 0;
        comm.all_reduce_sum(&any, 1, comm.world());  // the trainer's stop agreement
        dist::finish_gradients(params, *ctx);
        dist::global_grad_norm(params, layout, *ctx);
        for (nn::Parameter* p : params) p->value.set_grad(Tensor());
        if (rank == 0 && step == 1) {
          measured.all_reduce_bytes = comm.stats.all_reduce_bytes - before.all_reduce_bytes;
          measured.all_gather_bytes = comm.stats.all_gather_bytes - before.all_gather_bytes;
          measured.reduce_scatter_bytes = comm.stats.reduce_scatter_bytes - before.reduce_scatter_bytes;
          measured.all_to_all_bytes = comm.stats.all_to_all_bytes - before.all_to_all_bytes;
          measured.calls = comm.stats.calls - before.calls;
        }
      }
    });
    plan::Request r;
    r.model = mc;
    r.batch = B;
    r.seq = T;
    r.devices = c.mesh.size();
    r.device = fake_device();
    r.precision = "f32";
    plan::Layout l;
    l.data = c.mesh.data;
    l.tensor = c.mesh.tensor;
    l.expert = c.mesh.expert;
    l.shard = c.mode == dist::ParallelMode::Fsdp || c.mode == dist::ParallelMode::FsdpTp || c.mode == dist::ParallelMode::FsdpEp
                  ? "fsdp"
                  : "none";
    l.recompute = c.recompute;
    ASSERT_EQ(l.loom_mode(), dist::parallel_mode_name(c.mode));
    const plan::Estimate e = plan::estimate(r, l);
    ASSERT_TRUE(e.invalid.empty()) << e.invalid;
    std::map<std::string, double> planned;
    double planned_calls = 0;
    for (const plan::Collective& k : e.collectives) {
      planned[k.kind] += k.bytes;
      planned_calls += k.calls;
    }
    const std::string what = c.preset + " " + dist::parallel_mode_name(c.mode) + " " + c.mesh.str() + " recompute " +
                             models::recompute_name(c.recompute);
    EXPECT_EQ(planned["all_reduce"], static_cast<double>(measured.all_reduce_bytes)) << what;
    EXPECT_EQ(planned["all_gather"], static_cast<double>(measured.all_gather_bytes)) << what;
    EXPECT_EQ(planned["reduce_scatter"], static_cast<double>(measured.reduce_scatter_bytes)) << what;
    // The calls too (what the measured per-call costs multiply): every gather, reduce-scatter, bucket and
    // scalar sum. The expert modes' count exchanges are not planned.
    if (c.mesh.expert == 1) {
      EXPECT_EQ(planned_calls, static_cast<double>(measured.calls)) << what;
    }
    if (c.mesh.expert > 1) {  // the routing decides the all-to-alls: within the balanced estimate's order
      EXPECT_GT(static_cast<double>(measured.all_to_all_bytes), 0.25 * planned["all_to_all"]) << what;
      EXPECT_LT(static_cast<double>(measured.all_to_all_bytes), 2.0 * planned["all_to_all"]) << what;
    }
  }
}

// Under a pipe axis: the stage the plan gives its numbers for (the most loaded) sends exactly the
// planned point-to-point bytes and all-reduces exactly the planned bytes (its gradients over data, the
// tied table over the first and last stage, the scalars), in a step run as the trainer runs it.
TEST(Plan, PipeBytesEqualLoomsCounts) {
  set_num_threads(1);
  struct Case {
    std::string preset;
    std::string mesh;
    std::string schedule;
    int64_t M = 3;          // micro-batches per step
    int64_t chunks = 1;     // virtual stages per rank (interleaved)
  };
  const std::vector<Case> cases = {
      {"tiny", "pipe=2", "1f1b"}, {"tiny", "pipe=2,data=2", "gpipe"}, {"gpt2-small", "pipe=2", "1f1b"},
      {"gpt2-small", "pipe=3,data=2", "1f1b"},
      // Interleaved: v messages each way per micro-batch; the stages cut by loom's estimate over P v.
      {"tiny", "pipe=2,data=2", "interleaved", 4, 2}, {"gpt2-small", "pipe=2", "interleaved", 2, 2}};
  for (const Case& c : cases) {
    const dist::Mesh mesh = dist::Mesh::parse(c.mesh);
    const models::ModelConfig mc =
        c.preset == "gpt2-small"
            ? model_of("gpt2-small", {"model.vocab_size=128", "model.context_length=16", "model.d_model=32",
                                      "model.num_layers=4", "model.num_heads=4"})
            : model_of(c.preset, {"model.context_length=16", "model.num_layers=4"});
    const int64_t B = 8, T = 16, M = c.M;  // B rows per micro-batch, M micro-batches per step
    plan::Request r;
    r.model = mc;
    r.batch = B * M;
    r.seq = T;
    r.devices = mesh.size();
    r.device = fake_device();
    r.precision = "f32";
    plan::Layout l;
    l.data = mesh.data;
    l.pipe = mesh.pipe;
    l.shard = "none";
    l.micro_batches = M;
    l.schedule = c.schedule;
    l.virtual_stages = c.chunks;
    ASSERT_EQ(l.loom_mode(), "dp");
    const plan::Estimate e = plan::estimate(r, l);
    ASSERT_TRUE(e.invalid.empty()) << e.invalid;
    const int watched = static_cast<int>(mesh.rank_at(0, 0, 0, e.worst_stage));
    dist::CommStats measured;
    dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, dist::ParallelMode::Dp, &comm, rank, true});
      ctx->pipe_schedule = c.schedule;
      ctx->pipe_chunks = c.chunks;
      if (c.chunks == 1) ctx->pipe_bounds = e.stage_bounds;  // the plan's cut
      auto model = mc.build(5);
      const auto layout = dist::shard_model(*model, ctx);
      auto params = model->parameters();
      for (int step = 0; step < 2; ++step) {
        const dist::CommStats before = comm.stats;
        std::vector<dist::MicroBatch> micro;
        for (int64_t m = 0; m < M; ++m) {
          Tensor ids = ids_for(B, T + 1, mc.vocab_size(), static_cast<uint64_t>(7 + step * M + m));
          micro.push_back({dist::local_batch(ops::narrow(ids, 1, 0, T), *ctx), dist::local_batch(ops::narrow(ids, 1, 1, T), *ctx),
                           models::ForwardContext::train(RngKey::from_seed(1))});
        }
        dist::pipeline_step(*model, params, micro, *ctx);
        double any = 0;
        comm.all_reduce_sum(&any, 1, comm.world());  // the trainer's stop agreement
        dist::finish_gradients(params, *ctx);
        dist::finish_pipe_gradients(params, *ctx);
        dist::global_grad_norm(params, layout, *ctx);
        for (nn::Parameter* p : params) p->value.set_grad(Tensor());
        if (rank == watched && step == 1) {
          measured.all_reduce_bytes = comm.stats.all_reduce_bytes - before.all_reduce_bytes;
          measured.all_gather_bytes = comm.stats.all_gather_bytes - before.all_gather_bytes;
          measured.send_bytes = comm.stats.send_bytes - before.send_bytes;
        }
      }
    });
    std::map<std::string, double> planned;
    double planned_calls = 0;
    for (const plan::Collective& k : e.collectives) {
      planned[k.kind] += k.bytes;
      planned_calls += k.calls;
    }
    const std::string what = c.preset + " " + c.mesh + " " + c.schedule + ", stage " + std::to_string(e.worst_stage);
    EXPECT_GT(measured.send_bytes, 0) << what;
    EXPECT_EQ(planned["send_recv"], static_cast<double>(measured.send_bytes)) << what;
    EXPECT_EQ(planned["all_reduce"], static_cast<double>(measured.all_reduce_bytes)) << what;
    EXPECT_EQ(planned["all_gather"], static_cast<double>(measured.all_gather_bytes)) << what;
  }
}

// The planner's parameter bytes per rank equal the shards loom keeps.
TEST(Plan, ParameterBytesPerRankEqualTheShards) {
  set_num_threads(1);
  const models::ModelConfig mc = model_of("tiny", {"model.context_length=16"});
  for (const auto& [mesh, mode] : std::vector<std::pair<dist::Mesh, dist::ParallelMode>>{
           {{2, 1, 1}, dist::ParallelMode::Dp}, {{4, 1, 1}, dist::ParallelMode::Fsdp},
           {{1, 4, 1}, dist::ParallelMode::Tp}, {{2, 2, 1}, dist::ParallelMode::FsdpTp}}) {
    std::vector<double> bytes(static_cast<size_t>(mesh.size()));
    dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, mode, &comm, rank, true});
      auto model = mc.build(5);
      dist::shard_model(*model, ctx);
      for (nn::Parameter* p : model->parameters()) bytes[static_cast<size_t>(rank)] += static_cast<double>(p->value.nbytes());
    });
    plan::Request r;
    r.model = mc;
    r.batch = 8;
    r.devices = mesh.size();
    r.device = fake_device();
    r.precision = "f32";
    plan::Layout l;
    l.data = mesh.data;
    l.tensor = mesh.tensor;
    l.shard = mode == dist::ParallelMode::Fsdp || mode == dist::ParallelMode::FsdpTp ? "fsdp" : "none";
    const plan::Estimate e = plan::estimate(r, l);
    EXPECT_EQ(e.params, bytes[0]) << mesh.str() << " " << dist::parallel_mode_name(mode);
    EXPECT_EQ(e.optimizer, 2 * bytes[0]);
  }
}

TEST(Plan, PicksAFittingLayoutAndExplainsTheOthers) {
  plan::Request r;
  r.model = model_of("gpt2-xl");
  r.batch = 512;
  r.seq = 1024;
  r.devices = 64;
  r.device = plan::device_named("h100");
  const plan::Plan p = plan::make_plan(r);
  ASSERT_FALSE(p.fitting.empty());
  EXPECT_TRUE(p.fitting.front().fits());
  EXPECT_NE(p.fitting.front().verdict.find("best"), std::string::npos);
  for (size_t i = 1; i < p.fitting.size(); ++i) EXPECT_GE(p.fitting[i].step_s, p.fitting[0].step_s);
  const nlohmann::json j = plan::to_json(p, 5);
  EXPECT_TRUE(j["best"]["fits"].get<bool>());
  EXPECT_GT(j["best"]["mfu"].get<double>(), 0.1);
  EXPECT_LT(j["best"]["mfu"].get<double>(), 0.75);
  // Pipeline bubble: (pipe - 1) / micro-batches of the compute.
  plan::Layout l{8, 1, 8, 1, "zero1", models::Recompute::None, 16, "1f1b"};
  const plan::Estimate e = plan::estimate(r, l);
  EXPECT_NEAR(e.bubble_s / e.compute_s, 7.0 / 16.0, 1e-12);
  // Interleaved with v = 4 stages per device (48 layers: 32 stages of 1-2 layers): a quarter of it,
  // for 4 times the point-to-point bytes (both directions on a middle stage, one on stage 0).
  plan::Layout il = l;
  il.schedule = "interleaved";
  il.virtual_stages = 4;
  const plan::Estimate ie = plan::estimate(r, il);
  ASSERT_TRUE(ie.invalid.empty()) << ie.invalid;
  EXPECT_NEAR(ie.bubble_s / ie.compute_s, 7.0 / 64.0, 1e-12);
  auto p2p = [](const plan::Estimate& x) {
    double b = 0;
    for (const plan::Collective& k : x.collectives) b += k.kind == "send_recv" ? k.bytes : 0;
    return b;
  };
  const plan::Estimate s0 = plan::estimate_stage(r, l, 0), is0 = plan::estimate_stage(r, il, 0);
  EXPECT_NEAR(p2p(is0) / p2p(s0), 7.0, 1e-12);  // 2v - 1 messages a micro-batch against 1
  il.virtual_stages = 7;  // 56 stages of 48 layers
  EXPECT_NE(plan::estimate(r, il).invalid.find("interleaved x7 on pipe=8"), std::string::npos);
}

// The tiny Llama (4 layers), batch 16, on 4 devices of fake_device(), f32.
static plan::Request tiny_on_four_devices() {
  plan::Request r;
  r.model = model_of("tiny", {"model.num_layers=4"});
  r.batch = 16;
  r.devices = 4;
  r.device = fake_device();
  r.precision = "f32";
  return r;
}

// loom's tensor parallelism gathers the head's table and every tensor rank computes all the logits and
// the loss for its tokens (mesh/mesh.h: lm_head (None, tensor), the batch replicated over tensor): the
// plan charges the head's 6·V·C FLOPs per token on each of the tensor ranks, unless the head is split
// (Megatron-LM's vocab-parallel head, the published-run rows). Without a tensor axis nothing changes.
TEST(Plan, TensorRanksRepeatLoomsWholeHead) {
  plan::Request r = tiny_on_four_devices();
  const double V = 512, C = 64, tokens = 16.0 * static_cast<double>(r.model.context_length());
  ASSERT_EQ(r.model.json().at("vocab_size").get<double>(), V);
  ASSERT_EQ(r.model.json().at("d_model").get<double>(), C);
  for (int64_t t : {2, 4}) {
    plan::Layout l;
    l.tensor = t;
    l.data = 4 / t;
    l.shard = l.data > 1 ? "fsdp" : "none";
    r.head_split = false;
    const plan::Estimate whole = plan::estimate(r, l);
    r.head_split = true;
    const plan::Estimate split = plan::estimate(r, l);
    EXPECT_DOUBLE_EQ(split.hardware_flops, split.model_flops);
    EXPECT_NEAR(whole.hardware_flops - split.hardware_flops, static_cast<double>(t - 1) * 6 * V * C * tokens, 1);
    EXPECT_NEAR(whole.compute_s / split.compute_s, whole.hardware_flops / split.hardware_flops, 1e-12);
    EXPECT_DOUBLE_EQ(whole.peak, split.peak);  // the memory stays loom's
    // Under a pipe axis the head is the last stage's: it grows by the repeat, the slowest stage with it.
    plan::Layout p = l;
    p.data = 1;
    p.pipe = 4 / t;
    p.shard = "none";
    p.micro_batches = 4;
    if (p.pipe < 2) continue;
    r.head_split = false;
    const double pw = plan::estimate(r, p).compute_s;
    r.head_split = true;
    const double ps = plan::estimate(r, p).compute_s;
    EXPECT_GT(pw, ps * 1.05);
  }
  plan::Layout dp;
  dp.data = 4;
  r.head_split = false;
  const plan::Estimate a = plan::estimate(r, dp);
  r.head_split = true;
  EXPECT_DOUBLE_EQ(a.compute_s, plan::estimate(r, dp).compute_s);
  EXPECT_DOUBLE_EQ(a.hardware_flops, a.model_flops);
}

// The families a tensor axis leaves whole (DeviceSpec::tensor_replicated_share of the one-process step)
// run on every tensor rank: a tensor layout's compute grows by share x (the whole step's compute at the
// rank's efficiency) x (t - 1) / ranks, worked out here from the model's FLOPs; layouts without a tensor
// axis do not change, and neither do the FLOPs, bytes or memory.
TEST(Plan, TensorRanksRunTheFamiliesTheyLeaveWhole) {
  plan::Request r = tiny_on_four_devices();
  plan::Layout tp;
  tp.tensor = 4;
  plan::Layout ftp;
  ftp.tensor = 2;
  ftp.data = 2;
  ftp.shard = "fsdp";
  plan::Layout dp;
  dp.data = 4;
  for (const plan::Layout& l : {tp, ftp, dp}) {
    r.device.tensor_replicated_share = 0;
    const plan::Estimate without = plan::estimate(r, l);
    r.device.tensor_replicated_share = 0.1;
    const plan::Estimate with = plan::estimate(r, l);
    // The whole step on one device: the model's FLOPs at the peak the compute was charged at.
    const double one_device = without.model_flops / (without.hardware_flops / (4 * without.compute_s));
    EXPECT_NEAR(with.compute_s - without.compute_s, 0.1 * one_device * static_cast<double>(l.tensor - 1) / 4,
                1e-12 * one_device)
        << l.tensor;
    EXPECT_DOUBLE_EQ(with.hardware_flops, without.hardware_flops);
    EXPECT_DOUBLE_EQ(with.peak, without.peak);
    EXPECT_EQ(with.collectives.size(), without.collectives.size());
  }
}

// The search tries interleaved 1F1B beside plain 1F1B where loom runs it (micro-batches a multiple of
// pipe, pipe x v <= layers), and picks it when its smaller bubble makes the step faster and it fits.
TEST(Plan, SearchTriesInterleavedWhereItHelps) {
  plan::Request r;
  r.model = model_of("gpt2-xl");  // 48 blocks
  r.batch = 512;
  r.seq = 1024;
  r.devices = 64;
  r.device = plan::device_named("h100");
  const plan::Plan p = plan::make_plan(r);
  ASSERT_FALSE(p.fitting.empty());
  int interleaved = 0;
  for (const auto* list : {&p.fitting, &p.rejected}) {
    for (const plan::Estimate& e : *list) {
      if (e.layout.schedule != "interleaved") continue;
      ++interleaved;
      EXPECT_GT(e.layout.pipe, 1) << e.layout.str();
      EXPECT_EQ(e.layout.micro_batches % e.layout.pipe, 0) << e.layout.str();
      EXPECT_LE(e.layout.pipe * e.layout.virtual_stages, 48) << e.layout.str();
      EXPECT_GE(e.layout.virtual_stages, 2) << e.layout.str();
    }
  }
  EXPECT_GT(interleaved, 0);
  // Each fitting 1F1B pipeline layout against its interleaved twins that fit: a bubble v times smaller,
  // the same compute, and more messages, which cost the step only where the overlapped traffic outgrows
  // the compute (FSDP's gathers with many chunks): the step moves by exactly those terms, and where
  // the messages stay hidden interleaving is faster.
  int compared = 0, faster = 0;
  for (const plan::Estimate& e : p.fitting) {
    if (e.layout.pipe < 2 || e.layout.schedule != "1f1b" || e.layout.micro_batches % e.layout.pipe != 0) continue;
    for (const plan::Estimate& f : p.fitting) {
      const plan::Layout &a = e.layout, &b = f.layout;
      if (b.schedule != "interleaved" || a.data != b.data || a.tensor != b.tensor || a.pipe != b.pipe ||
          a.expert != b.expert || a.shard != b.shard || a.recompute != b.recompute || a.micro_batches != b.micro_batches) {
        continue;
      }
      EXPECT_NEAR(f.bubble_s * static_cast<double>(b.virtual_stages), e.bubble_s, 1e-9 * e.bubble_s) << b.str();
      EXPECT_DOUBLE_EQ(f.compute_s, e.compute_s) << b.str();
      // (AdamW's time is the most loaded stage's, whose cut differs a little between P and P x v stages.)
      EXPECT_NEAR(f.step_s - e.step_s,
                  (f.bubble_s - e.bubble_s) + (f.exposed_comm_s - e.exposed_comm_s) + (f.optimizer_s - e.optimizer_s),
                  1e-9 * e.step_s)
          << b.str();
      if (f.exposed_comm_s <= e.exposed_comm_s + 1e-12) {
        EXPECT_LT(f.step_s, e.step_s) << b.str() << " against " << a.str();
        ++faster;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_GT(faster, 0);
  // Here the best layout is a pipeline, so it is interleaved.
  const plan::Layout& best = p.fitting.front().layout;
  ASSERT_GT(best.pipe, 1) << best.str();
  EXPECT_EQ(best.schedule, "interleaved") << best.str();
  // With as many stages as blocks there is no room for a second chunk: no interleaved layout.
  r.model = model_of("tiny", {"model.num_layers=2"});
  r.batch = 8;
  r.seq = 64;
  r.devices = 2;
  for (const plan::Estimate& e : plan::make_plan(r).fitting) {
    if (e.layout.pipe == 2) {
      EXPECT_EQ(e.layout.schedule, "1f1b") << e.layout.str();
    }
  }
}

// The planner's memory per device against the allocator's peak over a whole step (forward, backward,
// gradient sums, AdamW) of loom's own runs: in-process ranks share one allocator, so both sides are
// summed over the ranks. Activations dominate (batch 8 x 64 tokens through 4 layers).
TEST(Plan, MemoryPerDeviceMatchesTheAllocatorsPeak) {
  set_num_threads(1);
  const models::ModelConfig mc = model_of("tiny", {"model.num_layers=4"});
  const int64_t B = 8, T = 64;
  struct Case {
    dist::Mesh mesh;
    dist::ParallelMode mode;
    models::Recompute recompute;
  };
  for (const Case& c : std::vector<Case>{{{2, 1, 1}, dist::ParallelMode::Dp, models::Recompute::None},
                                         {{2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::None},
                                         {{2, 1, 1}, dist::ParallelMode::Dp, models::Recompute::Selective},
                                         {{2, 1, 1}, dist::ParallelMode::Fsdp, models::Recompute::Full},
                                         {{1, 2, 1}, dist::ParallelMode::Tp, models::Recompute::None}}) {
    Allocator& a = allocator_for(Device::cpu());
    const int64_t base = a.stats().bytes_in_use;
    int64_t peak = 0;
    dist::run_in_process(static_cast<int>(c.mesh.size()), [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{c.mesh, c.mode, &comm, rank, true});
      auto model = mc.build(5);
      const auto layout = dist::shard_model(*model, ctx);
      auto params = model->parameters();
      train::AdamW opt(params, {});
      for (int step = 0; step < 2; ++step) {
        comm.barrier(comm.world());
        opt.zero_grad();  // as the trainer, before the step's forward
        if (step == 1 && rank == 0) a.reset_peak();
        comm.barrier(comm.world());
        Tensor ids = ids_for(B, T + 1, mc.vocab_size(), 7 + step);
        Tensor x = ops::narrow(ids, 1, 0, T), y = ops::narrow(ids, 1, 1, T);
        Tensor loss = model->loss(dist::local_batch(x, *ctx), dist::local_batch(y, *ctx),
                                  models::ForwardContext::train(RngKey::from_seed(1), c.recompute));
        dist::backward(loss, params, *ctx);
        dist::finish_gradients(params, *ctx);
        dist::global_grad_norm(params, layout, *ctx);
        opt.step(1e-3f);
        comm.barrier(comm.world());
        if (step == 1 && rank == 0) peak = a.stats().peak_bytes_in_use - base;
        comm.barrier(comm.world());
      }
    });
    plan::Request r;
    r.model = mc;
    r.batch = B;
    r.seq = T;
    r.devices = c.mesh.size();
    r.device = fake_device();
    r.precision = "f32";
    plan::Layout l;
    l.data = c.mesh.data;
    l.tensor = c.mesh.tensor;
    l.shard = c.mode == dist::ParallelMode::Fsdp ? "fsdp" : "none";
    l.recompute = c.recompute;
    const plan::Estimate e = plan::estimate(r, l);
    const double planned = e.memory() * static_cast<double>(c.mesh.size());
    std::printf("%s %s %s: allocator peak %lld, plan %.0f (%.3f): params %.0f grads %.0f adamw %.0f act %.0f peak-phase rest %.0f\n",
                c.mesh.str().c_str(), dist::parallel_mode_name(c.mode), models::recompute_name(c.recompute),
                static_cast<long long>(peak), planned, static_cast<double>(peak) / planned, e.params, e.grads, e.optimizer,
                e.activations, e.transient);
    // In-process ranks share one allocator and do not reach their peaks at the same instant, so the
    // peak of the sum is at most the sum of the peaks the plan gives (under mpirun each rank's own
    // allocator is compared: docs/plan.md).
    EXPECT_GT(static_cast<double>(peak) / planned, 0.80) << c.mesh.str() << " " << dist::parallel_mode_name(c.mode);
    EXPECT_LT(static_cast<double>(peak) / planned, 1.05) << c.mesh.str() << " " << dist::parallel_mode_name(c.mode);
  }
}

// The efficiency measured at several GEMM heights: interpolated in log(rows), held outside, and taken at
// the tokens of a micro-batch on a rank.
TEST(Plan, EfficiencyIsTakenAtTheRowsOfAMicroBatch) {
  plan::DeviceSpec d = fake_device();
  d.gemm_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(d.efficiency_at(100), 0.5);  // none measured: the one assumption
  d.efficiency_by_rows = {{1024, 0.6}, {128, 0.3}};
  EXPECT_DOUBLE_EQ(d.efficiency_at(128), 0.3);
  EXPECT_DOUBLE_EQ(d.efficiency_at(16), 0.3);
  EXPECT_DOUBLE_EQ(d.efficiency_at(4096), 0.6);
  EXPECT_NEAR(d.efficiency_at(std::sqrt(128.0 * 1024.0)), 0.45, 1e-12);

  plan::Request r;
  r.model = model_of("tiny", {"model.num_layers=4"});
  r.batch = 16;
  r.seq = 64;
  r.devices = 2;
  r.precision = "f32";
  r.device = fake_device();
  r.device.gemm_efficiency = 0.5;
  plan::Layout dp;
  dp.data = 2;
  dp.micro_batches = 2;  // 16 / 2 ranks / 2 micro-batches = 4 sequences, 256 rows
  const plan::Estimate one = plan::estimate(r, dp);
  r.device.efficiency_by_rows = {{128, 0.5}, {512, 0.125}};  // at 256 rows: 0.3125
  const plan::Estimate measured = plan::estimate(r, dp);
  EXPECT_NEAR(measured.compute_s, one.compute_s * 0.5 / 0.3125, 1e-12 * one.compute_s);
}

// Measured collective costs (docs/plan/cpu-collectives.json): the lookup, the interpolation, the file,
// and what the planner charges with them.
TEST(Plan, MeasuredCollectiveCostsAreChargedPerCall) {
  plan::CollectiveCost c;
  c.points = {{8, 1e-4}, {1024, 2e-4}, {2048, 4e-4}};
  EXPECT_DOUBLE_EQ(c.seconds(1), 1e-4);           // below the smallest payload: its cost
  EXPECT_DOUBLE_EQ(c.seconds(516), 1.5e-4);       // between: linear
  EXPECT_DOUBLE_EQ(c.seconds(4096), 8e-4);        // above: the last segment's slope
  c.points = {{8, 3e-4}, {1024, 1e-4}};
  EXPECT_DOUBLE_EQ(c.seconds(1 << 20), 1e-4);     // a falling last segment is held flat above it

  plan::DeviceSpec d = fake_device();
  auto entry = [](std::string kind, int group, int ranks, double gap, double seconds) {
    plan::CollectiveCost k;
    k.kind = std::move(kind);
    k.group = group;
    k.ranks = ranks;
    k.gap_s = gap;
    k.points = {{8, seconds}, {1 << 20, seconds}};
    return k;
  };
  d.collective_costs = {entry("all_reduce", 2, 2, 1e-4, 1e-3), entry("all_reduce", 2, 2, 1e-3, 2e-3),
                        entry("all_reduce", 2, 8, 1e-4, 5e-3), entry("started_all_gather", 2, 2, 1e-4, 3e-5)};
  EXPECT_EQ(d.cost_of("all_reduce", 2, 2, 2e-4)->points[0].second, 1e-3);  // the nearest gap by ratio
  EXPECT_EQ(d.cost_of("all_reduce", 2, 2, 8e-4)->points[0].second, 2e-3);
  EXPECT_EQ(d.cost_of("all_reduce", 2, 4, 1e-4)->points[0].second, 5e-3);  // 4 ranks: the 8-rank entry
  EXPECT_EQ(d.cost_of("all_reduce", 2, 16, 1e-4)->points[0].second, 5e-3); // beyond: the largest
  EXPECT_EQ(d.cost_of("all_reduce", 4, 4, 1e-4), nullptr);
  EXPECT_EQ(d.cost_of("all_gather", 2, 2, 1e-4), nullptr);

  // Tensor parallelism's all-reduces are blocking: each call costs the measured entry's seconds; FSDP's
  // gathers and reduce-scatters are started in the background: each adds the measured exposed part.
  plan::Request r;
  r.model = model_of("tiny", {"model.num_layers=4"});
  r.batch = 16;
  r.devices = 2;
  r.device = d;
  r.precision = "f32";
  plan::Layout tp;
  tp.tensor = 2;
  const plan::Estimate with = plan::estimate(r, tp);
  r.device.collective_costs.clear();
  const plan::Estimate without = plan::estimate(r, tp);
  double extra = 0;
  for (size_t i = 0; i < with.collectives.size(); ++i) {
    const plan::Collective& k = with.collectives[i];
    if (k.kind != "all_reduce") {
      EXPECT_FALSE(k.measured) << k.name;
      continue;
    }
    EXPECT_TRUE(k.measured) << k.name;
    const double per_call = d.cost_of("all_reduce", 2, 2, with.compute_s / 32)->points[0].second;
    EXPECT_DOUBLE_EQ(k.seconds, k.calls * per_call) << k.name;
    extra += k.seconds - without.collectives[i].seconds;
  }
  EXPECT_NEAR(with.step_s - without.step_s, extra, 1e-12);
  r.device = d;
  plan::Layout fsdp;
  fsdp.data = 2;
  fsdp.shard = "fsdp";
  const plan::Estimate f = plan::estimate(r, fsdp);
  double exposed = 0;
  for (const plan::Collective& k : f.collectives) {
    EXPECT_TRUE(k.measured) << k.name;
    if (k.overlapped) {
      EXPECT_DOUBLE_EQ(k.seconds, k.calls * 3e-5) << k.name;
    }
    exposed += k.seconds;
  }
  EXPECT_NEAR(f.exposed_comm_s, exposed, 1e-12);  // nothing measured is hidden again

  // Ranks sharing cores: each call's measured CPU, with the compute and AdamW at a whole core, over the
  // cores, is a floor under the step.
  plan::DeviceSpec shared = d;
  for (plan::CollectiveCost& k : shared.collective_costs) k.cpu_points = {{8, 2e-5}, {1 << 20, 2e-5}};
  shared.cores = 2;
  r.device = shared;
  EXPECT_DOUBLE_EQ(shared.collective_costs[0].cpu_seconds(4096), 2e-5);
  const plan::Estimate fs = plan::estimate(r, fsdp);
  double calls = 0;
  for (const plan::Collective& k : fs.collectives) calls += k.group >= 2 ? k.calls : 0;
  EXPECT_NEAR(fs.comm_cpu_s, 2e-5 * calls, 1e-12);
  EXPECT_NEAR(fs.cpu_s, fs.compute_s + fs.optimizer_s + fs.comm_cpu_s, 1e-12);
  EXPECT_NEAR(fs.cpu_bound_s, fs.cpu_s, 1e-12);  // 2 ranks, 2 cores: each rank's own
  EXPECT_DOUBLE_EQ(fs.step_s, std::max(fs.cpu_bound_s, fs.compute_s + fs.bubble_s + fs.exposed_comm_s + fs.optimizer_s));
  // A call that takes more CPU than its wait: the floor is the step.
  for (plan::CollectiveCost& k : shared.collective_costs) k.cpu_points = {{8, 1e-3}, {1 << 20, 1e-3}};
  r.device = shared;
  const plan::Estimate heavy = plan::estimate(r, fsdp);
  EXPECT_GT(heavy.cpu_bound_s, heavy.compute_s + heavy.exposed_comm_s + heavy.optimizer_s);
  EXPECT_DOUBLE_EQ(heavy.step_s, heavy.cpu_bound_s);
  // 4 ranks on the 2 cores (each given half a core's peak): all four ranks' CPU over 2 cores.
  r.devices = 4;
  shared.peak_share = 0.5;
  shared.f32_flops *= 0.5;
  shared.bf16_flops *= 0.5;
  r.device = shared;
  plan::Layout fsdp4 = fsdp;
  fsdp4.data = 4;
  const plan::Estimate f4 = plan::estimate(r, fsdp4);
  EXPECT_NEAR(f4.cpu_s, 0.5 * f4.compute_s + f4.optimizer_s + f4.comm_cpu_s, 1e-12);
  EXPECT_NEAR(f4.cpu_bound_s, 2 * f4.cpu_s, 1e-12);
  // With more ranks than cores a waiting rank leaves its core to a computing one: the chain runs at a
  // whole core (compute and bubble times the peak share) and a blocking call costs the entry measured
  // with a core per rank (2 ranks here, 1e-3 s; the 8-rank entry, 5e-3 s, is the scheduling the floor
  // already counts).
  plan::Layout tp4 = tp;
  tp4.data = 2;
  const plan::Estimate t4 = plan::estimate(r, tp4);
  double blocking = 0, tp_calls = 0;
  for (const plan::Collective& k : t4.collectives) blocking += k.overlapped ? 0 : k.calls;
  const double per_call = d.cost_of("all_reduce", 2, 2, 0.5 * t4.compute_s / blocking)->points[0].second;
  for (const plan::Collective& k : t4.collectives) {
    if (k.axis != "tensor" || k.kind != "all_reduce") continue;
    EXPECT_TRUE(k.measured) << k.name;
    EXPECT_DOUBLE_EQ(k.seconds, k.calls * per_call) << k.name;
    tp_calls += k.calls;
  }
  EXPECT_GT(tp_calls, 0);
  EXPECT_NEAR(t4.step_s,
              std::max(t4.cpu_bound_s, 0.5 * (t4.compute_s + t4.bubble_s) + t4.exposed_comm_s + t4.optimizer_s), 1e-12);
  // The compute's own slowdown from sharing the cores (measured by tools/plan_check.py): the chain and
  // the floor's compute grow by it, the collectives and AdamW do not; with a core per rank it is unused.
  shared.shared_core_slowdown = 1.2;
  r.device = shared;
  const plan::Estimate s4 = plan::estimate(r, tp4);
  EXPECT_NEAR(s4.cpu_s, (0.5 * s4.compute_s * 1.2 + s4.optimizer_s) + s4.comm_cpu_s, 1e-12);
  EXPECT_NEAR(s4.cpu_s - t4.cpu_s, 0.5 * t4.compute_s * 0.2, 1e-12);
  EXPECT_NEAR(s4.step_s,
              std::max(s4.cpu_bound_s, 0.5 * 1.2 * (s4.compute_s + s4.bubble_s) + s4.exposed_comm_s + s4.optimizer_s),
              1e-12);
  r.devices = 2;
  {
    plan::DeviceSpec own = shared;  // 2 ranks on 2 cores: the slowdown does not apply
    own.peak_share = 1;
    own.f32_flops = d.f32_flops;
    own.bf16_flops = d.bf16_flops;
    for (plan::CollectiveCost& k : own.collective_costs) k.cpu_points = {{8, 1e-3}, {1 << 20, 1e-3}};
    r.device = own;
    const plan::Estimate with = plan::estimate(r, fsdp);
    own.shared_core_slowdown = 1;
    r.device = own;
    EXPECT_DOUBLE_EQ(with.step_s, plan::estimate(r, fsdp).step_s);
    EXPECT_DOUBLE_EQ(with.cpu_s, heavy.cpu_s);
  }
  r.device = d;  // no shared cores (a GPU's spec): no floor
  EXPECT_EQ(plan::estimate(r, fsdp).cpu_bound_s, 0);

  // The data file: read back, and a malformed one named.
  const std::string path = ::testing::TempDir() + "/loom_collectives.json";
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    std::fputs(R"({"command": "x", "measured_at": "now", "costs": [{"kind": "all_reduce", "group": 2, "ranks": 2,
                 "gap_s": 0.0001, "points": [[1048576, 0.002], [8, 0.001]], "cpu_points": [[1048576, 4e-4], [8, 1e-5]]}]})", out);
    std::fclose(out);
  }
  plan::DeviceSpec loaded = fake_device();
  plan::load_collective_costs(loaded, path);
  ASSERT_EQ(loaded.collective_costs.size(), 1u);
  EXPECT_EQ(loaded.collective_costs[0].points.front().first, 8);  // sorted by bytes
  EXPECT_DOUBLE_EQ(loaded.collective_costs[0].cpu_seconds(8), 1e-5);
  EXPECT_NE(loaded.sources["collective_costs"].find("now"), std::string::npos);
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    std::fputs(R"({"costs": [{"kind": "all_reduce", "group": 1, "ranks": 2, "gap_s": 0, "points": [[8, 1]]}]})", out);
    std::fclose(out);
  }
  try {
    plan::load_collective_costs(loaded, path);
    ADD_FAILURE() << "a group of 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan::load_collective_costs(loaded, path + ".missing"), Error);
  std::remove(path.c_str());
}

// A pipeline's schedule with the cores shared among the ranks that can run (the plan's term for more
// ranks than cores). With a core per stage: the fill and drain, (M + P - 1) / M of a stage's work for
// even stages, GPipe and 1F1B alike; with one core for all, no core ever idles: the work's sum; with
// 2 cores for 4 stages, the sum over the cores and the idle of the fill and drain (6.375, as a separate
// event simulation in Python gave). An uneven last stage paces the others: with a core each, its
// forwards start after three of the others' (3 x 1/12), run 4 x 1/6, then its backwards 4 x 1/3, and
// the last micro-batch's gradient takes 3 x 1/6 back to the first stage: 2.75.
TEST(Plan, SharedCorePipelineSchedule) {
  const std::vector<double> even(4, 3.0);
  for (const char* s : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(s);
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, even, 8, 4), 3.0 * (8 + 3) / 8, 1e-9);
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, even, 8, 8), 3.0 * (8 + 3) / 8, 1e-9);  // a core each at most
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, even, 8, 1), 12.0, 1e-9);
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, even, 8, 2), 6.375, 1e-9);
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, {1, 1, 1, 2}, 4, 4), 2.75, 1e-9);
    EXPECT_NEAR(plan::shared_core_pipeline_s(s, {5.0}, 3, 1), 5.0, 1e-9);  // one stage: its work
  }
  // Interleaved (2 chunks a rank, Megatron-LM's order as loom runs it): no idle on one core, and with a
  // core each a shorter fill and drain than 1F1B's, never shorter than a stage's work.
  EXPECT_NEAR(plan::shared_core_pipeline_s("interleaved", even, 8, 1, 2), 12.0, 1e-9);
  const double interleaved = plan::shared_core_pipeline_s("interleaved", even, 8, 4, 2);
  EXPECT_LT(interleaved, 3.0 * (8 + 3) / 8 - 1e-6);
  EXPECT_GE(interleaved, 3.0);
  EXPECT_THROW(plan::shared_core_pipeline_s("interleaved", even, 8, 2), Error);     // one chunk
  EXPECT_THROW(plan::shared_core_pipeline_s("interleaved", even, 6, 2, 2), Error);  // 6 % 4 micro-batches
  EXPECT_THROW(plan::shared_core_pipeline_s("1f1b", even, 0, 2), Error);
  EXPECT_THROW(plan::shared_core_pipeline_s("1f1b", even, 8, 0), Error);
}
