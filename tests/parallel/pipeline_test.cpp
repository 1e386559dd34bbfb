// The pipe axis (parallel/pipeline.h): the schedules' orders, the stage cuts, and training through the
// stages against one process: 20 AdamW steps (clipping on) of tiny Llama and GPT-2 models (tied and
// untied head) under GPipe, 1F1B and interleaved 1F1B, pipe alone and with data, fsdp and tensor inside
// the stages, with the in-process communicator; losses within 1e-5 relative, every parameter within 1e-5.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/parallel.h"
#include "models/deepseek_v3/model.h"
#include "models/gpt2/model.h"
#include "models/llama/model.h"
#include "ops/elementwise.h"
#include "parallel/pipeline.h"
#include "parallel/runtime.h"
#include "support/equivalence.h"
#include "support/synthetic_batch.h"
#include "train/optimizer.h"

using namespace loom;
using dist::Mesh;
using dist::ParallelMode;

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 8, kSeq = 8, kVocab = 64, kLayers = 4;
constexpr double kClip = 0.5;

std::unique_ptr<models::LanguageModel> build(const std::string& arch) {
  if (arch == "llama") {
    const llama::Config c{.vocab_size = kVocab, .context_length = 16, .d_model = 32, .num_layers = kLayers,
                          .num_heads = 8, .num_kv_heads = 4, .d_ff = 64};
    return std::make_unique<llama::TransformerLM>(c, 7);
  }
  const gpt2::Config c{.vocab_size = kVocab, .context_length = 16, .d_model = 32, .num_layers = kLayers,
                       .num_heads = 8, .tie_embeddings = arch == "gpt2", .dropout = 0};
  return std::make_unique<gpt2::GPT2>(c, 7);
}

// Five batches in turn: random tokens the models can learn only by heart, so the loss goes down (and the
// test sees training, not noise) within 20 steps.
std::pair<Tensor, Tensor> batch_of(int index) { return test::synthetic_batch(index % 5, kBatch, kSeq, kVocab); }
train::AdamWOptions adamw() { return {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

struct TrainRun {
  std::vector<double> losses, norms;
  test::WholeParameters params;
  double bubble = 0;            // rank 0's idle share of its pipeline steps
  int64_t send_bytes = 0;       // what rank 0 sent point to point
  int64_t peak_in_flight = 0;   // rank 0's most micro-batches held at once
};

// One process, `micro` micro-batches per step (micro-batch m of step s reads batch_of(s * micro + m)),
// each loss scaled by 1/micro as the trainer does. With row_groups > 1, each micro-batch's rows go
// through the model in that many equal groups, each loss scaled by 1/row_groups more, and the gradient
// is summed as a data split of row_groups ranks sums it: each group's over its micro-batches in order,
// then the groups' sums added at the end as the all-reduce adds the ranks' (see PipeEquivalence for why
// the data cases compare against it).
TrainRun train_single(const std::string& arch, int micro, int64_t row_groups = 1) {
  TrainRun run;
  auto model = build(arch);
  auto params = model->parameters();
  train::AdamW opt(params, adamw());
  const int64_t rows = kBatch / row_groups;
  const float scale = 1.0f / static_cast<float>(micro * row_groups);
  for (int s = 0; s < kSteps; ++s) {
    double loss_sum = 0;
    std::vector<std::vector<float>> group_sums(params.size());  // the groups' gradients added so far
    for (int64_t g = 0; g < row_groups; ++g) {
      opt.zero_grad();
      for (int m = 0; m < micro; ++m) {
        auto [ids, targets] = batch_of(s * micro + m);
        Tensor loss = row_groups > 1 ? model->loss(ids.slice(g * rows, rows), targets.slice(g * rows, rows))
                                     : model->loss(ids, targets);
        loss_sum += loss.item() / static_cast<double>(row_groups);
        (scale != 1.0f ? ops::scale(loss, scale) : loss).backward();
      }
      if (row_groups == 1) break;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::vector<float> grad = params[i]->value.grad().to_vector<float>();
        if (g == 0) {
          group_sums[i] = grad;
        } else {
          for (size_t j = 0; j < grad.size(); ++j) group_sums[i][j] += grad[j];
        }
      }
    }
    if (row_groups > 1) {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i]->value.set_grad(Tensor::from_vector(params[i]->value.shape(), group_sums[i]));
      }
    }
    run.losses.push_back(loss_sum / micro);
    run.norms.push_back(train::clip_grad_norm(train::gradients_of(params), kClip));
    opt.step();
  }
  for (nn::Parameter* p : params) run.params[p->name] = p->value.to_vector<float>();
  return run;
}

TrainRun train_pipelined(const std::string& arch, const Mesh& mesh, ParallelMode mode, const std::string& schedule,
                         int micro, std::vector<int64_t> bounds = {},
                         models::Recompute recompute = models::Recompute::None, int64_t chunks = 1) {
  TrainRun run;
  dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, mode, &comm, rank});
    ctx->pipe_schedule = schedule;
    ctx->pipe_chunks = chunks;
    ctx->pipe_bounds = bounds;
    auto model = build(arch);
    auto layout = dist::shard_model(*model, ctx);
    auto params = model->parameters();
    train::AdamW opt(params, adamw());
    // A rank holds the parameters its stage runs, and their moments, nothing of the others'.
    const int stage = static_cast<int>(ctx->coord(dist::MeshAxis::Pipe));
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& st = params[i]->pipe_stages;
      ASSERT_FALSE(st.empty()) << params[i]->name;
      const bool runs = std::find(st.begin(), st.end(), stage) != st.end();
      EXPECT_EQ(params[i]->value.numel() > 0, runs) << params[i]->name << " on stage " << stage;
      EXPECT_EQ(opt.exp_avg(i).numel(), params[i]->value.numel()) << params[i]->name;
    }
    double busy = 0, total = 0;
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      std::vector<dist::MicroBatch> batches;
      for (int m = 0; m < micro; ++m) {
        auto [ids, targets] = batch_of(s * micro + m);
        batches.push_back({dist::local_batch(ids, *ctx), dist::local_batch(targets, *ctx),
                           models::ForwardContext::train(RngKey::from_seed(3), recompute)});
      }
      dist::PipelineTiming timing;
      const double loss_sum = dist::pipeline_step(*model, params, batches, *ctx, &timing);
      busy += timing.busy_seconds;
      total += timing.seconds;
      dist::finish_gradients(params, *ctx);
      dist::finish_pipe_gradients(params, *ctx);
      const double norm = dist::clip_grad_norm(params, layout, *ctx, kClip);
      opt.step();
      if (rank == 0) {
        run.losses.push_back(loss_sum / micro);
        run.norms.push_back(norm);
        run.peak_in_flight = std::max(run.peak_in_flight, timing.peak_in_flight);
      }
    }
    if (rank == 0) {
      run.bubble = 1 - busy / total;
      run.send_bytes = comm.stats.send_bytes;
    }
    test::gather_parameters(params, *ctx, run.params);
  });
  return run;
}

class PipeEquivalence : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }
};

}  // namespace

namespace {

// Runs every rank's order on a clock: a forward of virtual stage vs waits for vs - 1's forward of the
// micro-batch, a backward for vs + 1's backward; sends take no time, a forward 1 and a backward 2
// units. Returns each rank's idle share of the makespan, or an empty vector when the ranks deadlock.
std::vector<double> simulate(const std::string& schedule, int64_t P, int64_t M, int64_t v) {
  const int64_t V = P * v;
  std::vector<std::vector<dist::PipeStep>> order;
  for (int64_t s = 0; s < P; ++s) order.push_back(dist::pipeline_order(schedule, P, s, M, v));
  std::map<std::tuple<bool, int64_t, int64_t>, double> done;  // (forward, virtual stage, micro) -> finish time
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0), busy(static_cast<size_t>(P), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < P; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      while (i < order[static_cast<size_t>(s)].size()) {
        const dist::PipeStep& st = order[static_cast<size_t>(s)][i];
        const int64_t vs = st.chunk * P + s;
        double ready = 0;
        const bool needs = st.forward ? vs > 0 : vs + 1 < V;
        if (needs) {
          auto it = done.find({st.forward, st.forward ? vs - 1 : vs + 1, st.micro});
          if (it == done.end()) break;  // waits for a neighbour
          ready = it->second;
        }
        const double cost = st.forward ? 1 : 2;
        double& t = clock[static_cast<size_t>(s)];
        t = std::max(t, ready) + cost;
        busy[static_cast<size_t>(s)] += cost;
        done[{st.forward, vs, st.micro}] = t;
        ++i;
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < P; ++s) {
    if (next[static_cast<size_t>(s)] < order[static_cast<size_t>(s)].size()) return {};
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  std::vector<double> idle;
  for (double b : busy) idle.push_back(1 - b / makespan);
  return idle;
}

}  // namespace

TEST(PipelineOrder, EveryMicroBatchRunsForwardThenBackwardOnce) {
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
    for (int64_t P : {1, 2, 4}) {
      for (int64_t v : schedule == "interleaved" ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{1}) {
        for (int64_t M : {1, 3, 8}) {
          if (schedule == "interleaved" && M % P != 0) continue;
          for (int64_t s = 0; s < P; ++s) {
            SCOPED_TRACE(schedule + " stage " + std::to_string(s) + " of " + std::to_string(P) + " x " +
                         std::to_string(v) + ", " + std::to_string(M) + " micro-batches");
            std::set<std::pair<int64_t, int64_t>> forwarded;
            std::vector<int64_t> next_backward(static_cast<size_t>(v), 0);
            int64_t in_flight = 0, peak = 0;
            for (const auto& [fwd, chunk, m] : dist::pipeline_order(schedule, P, s, M, v)) {
              ASSERT_TRUE(chunk >= 0 && chunk < v && m >= 0 && m < M);
              if (fwd) {
                EXPECT_TRUE(forwarded.insert({chunk, m}).second);
                peak = std::max(peak, ++in_flight);
              } else {
                EXPECT_TRUE(forwarded.count({chunk, m}));
                // In micro-batch order on every chunk: gradients accumulate as in one process.
                EXPECT_EQ(m, next_backward[static_cast<size_t>(chunk)]++);
                --in_flight;
              }
            }
            EXPECT_EQ(static_cast<int64_t>(forwarded.size()), M * v);
            for (int64_t n : next_backward) EXPECT_EQ(n, M);
            if (schedule != "interleaved") {
              EXPECT_EQ(peak, schedule == "gpipe" ? M : std::min(P - s, M));
            }
          }
          // All ranks together finish (no rank waits for a message nobody sends before it).
          const auto idle = simulate(schedule, P, M, v);
          ASSERT_FALSE(idle.empty()) << schedule << " deadlocks on pipe=" << P << " x " << v << ", M=" << M;
        }
      }
    }
  }
  // The clock's bubble against the formula: 1F1B and GPipe exactly (P - 1) / (M + P - 1); interleaved
  // (P - 1) / (v M + P - 1) on rank 0 (the others wait for the cool-down's last backwards a little more).
  for (const auto& [P, M, v] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 4, 2}, {4, 8, 2}, {4, 8, 4}, {2, 8, 3}}) {
    EXPECT_NEAR(simulate("1f1b", P, M, 1)[0], dist::ideal_bubble(P, M), 1e-12);
    EXPECT_NEAR(simulate("gpipe", P, M, 1)[0], dist::ideal_bubble(P, M), 1e-12);
    const auto idle = simulate("interleaved", P, M, v);
    std::printf("interleaved pipe=%lld x %lld, M=%lld: idle %.3f on rank 0, formula %.3f (1f1b %.3f)\n",
                static_cast<long long>(P), static_cast<long long>(v), static_cast<long long>(M), idle[0],
                dist::ideal_bubble(P, M, v), dist::ideal_bubble(P, M));
    EXPECT_NEAR(idle[0], dist::ideal_bubble(P, M, v), 1e-12);
  }
  EXPECT_THROW(dist::pipeline_order("zb", 2, 0, 2), Error);
  EXPECT_THROW(dist::pipeline_order("interleaved", 2, 0, 3, 2), Error);  // M not a multiple of P
  EXPECT_THROW(dist::pipeline_order("interleaved", 2, 0, 2, 1), Error);  // one stage per rank
  EXPECT_THROW(dist::pipeline_order("1f1b", 2, 0, 2, 2), Error);
}

TEST(StageBounds, BalanceTheEstimatedCostAndCheckTheHandSetCounts) {
  // Equal blocks, nothing at the ends: an even cut.
  EXPECT_EQ(dist::balanced_stage_bounds({1, 1, 1, 1}, 0, 0, 2), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(dist::balanced_stage_bounds({1, 1, 1, 1}, 0, 0, 4), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // A head as heavy as two blocks on the last stage: it gets fewer blocks.
  EXPECT_EQ(dist::balanced_stage_bounds({1, 1, 1, 1, 1, 1}, 0, 2, 2), (std::vector<int64_t>{0, 4, 6}));
  EXPECT_EQ(dist::balanced_stage_bounds({5, 1, 1, 1}, 0, 0, 2), (std::vector<int64_t>{0, 1, 4}));
  EXPECT_THROW(dist::balanced_stage_bounds({1, 1}, 0, 0, 3), Error);
  EXPECT_EQ(dist::stage_bounds_from_counts("3,1", 4, 2), (std::vector<int64_t>{0, 3, 4}));
  for (const std::string bad : {"3,2", "4", "2,0,2", "2,x", ""}) {
    EXPECT_THROW(dist::stage_bounds_from_counts(bad, 4, 2), Error) << bad;
  }
  try {
    dist::stage_bounds_from_counts("3,2", 4, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 blocks, but the model has 4"), std::string::npos) << e.what();
  }
  // A tiny Llama: the head (64 x 32) weighs about a block (~14k); the cut keeps every stage non-empty.
  auto model = build("llama");
  const auto bounds = dist::estimated_stage_bounds(*model, 2);
  ASSERT_EQ(bounds.size(), 3u);
  EXPECT_GT(bounds[1], 0);
  EXPECT_LT(bounds[1], kLayers);
}

TEST(PipeErrors, NameTheOffendingValue) {
  set_num_threads(1);
  auto expect_error = [](const Mesh& mesh, const std::string& schedule, const std::string& arch,
                         const std::string& needle) {
    try {
      dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
        auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, ParallelMode::Dp, &comm, rank});
        ctx->pipe_schedule = schedule;
        auto model = build(arch);
        dist::shard_model(*model, ctx);
      });
      ADD_FAILURE() << "no error for " << mesh.str();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Mesh five;
  five.pipe = 5;
  expect_error(five, "1f1b", "llama", "pipe=5 needs at least as many blocks, but the model has 4");
  Mesh two;
  two.pipe = 2;
  expect_error(two, "zero_bubble", "llama", "unknown pipeline schedule \"zero_bubble\"");
  EXPECT_EQ(Mesh::parse("pipe=4,data=2").size(), 8);
  EXPECT_EQ(Mesh::parse("pipe=4,data=2").str(), "data=2,tensor=1,pipe=4");
  EXPECT_THROW(Mesh::parse("pipe=2,pipe=2"), Error);
  EXPECT_THROW(Mesh::parse("pipe=0"), Error);
}

TEST(PipeMesh, PipeIsTheOutermostAxis) {
  Mesh m = Mesh::parse("data=2,tensor=2,pipe=2");
  EXPECT_EQ(m.coord(5, dist::MeshAxis::Pipe), 1);
  EXPECT_EQ(m.coord(5, dist::MeshAxis::Data), 0);
  EXPECT_EQ(m.coord(5, dist::MeshAxis::Tensor), 1);
  EXPECT_EQ(m.group(5, dist::MeshAxis::Pipe), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group(5, dist::MeshAxis::Data), (std::vector<int>{5, 7}));  // a stage's own data group
  EXPECT_EQ(m.rank_at(1, 1, 0, 1), 7);
}

TEST_P(PipeEquivalence, EveryScheduleMatchesOneProcess) {
  const std::string arch = GetParam();
  struct Case {
    Mesh mesh;
    ParallelMode mode;
    std::string schedule;
    int micro;
    std::vector<int64_t> bounds;
    models::Recompute recompute = models::Recompute::None;
  };
  const Mesh pipe2 = Mesh::parse("pipe=2"), pipe4 = Mesh::parse("pipe=4"), pipe2_data2 = Mesh::parse("pipe=2,data=2"),
             pipe2_tensor2 = Mesh::parse("pipe=2,tensor=2"), pipe2_data2_tensor2 = Mesh::parse("pipe=2,data=2,tensor=2"),
             pipe4_data2 = Mesh::parse("pipe=4,data=2");
  const std::vector<Case> cases = {
      {pipe2, ParallelMode::Dp, "gpipe", 4, {}},
      {pipe2, ParallelMode::Dp, "1f1b", 4, {0, 3, 4}},  // cut by hand, unevenly
      {pipe4, ParallelMode::Dp, "1f1b", 3, {}},         // fewer micro-batches than stages
      {pipe4, ParallelMode::Dp, "gpipe", 2, {}},
      {pipe2_data2, ParallelMode::Dp, "1f1b", 4, {}},
      {pipe2_data2, ParallelMode::Dp, "gpipe", 3, {}},
      {pipe2_data2, ParallelMode::Fsdp, "1f1b", 5, {}},
      {pipe2_data2, ParallelMode::Fsdp, "gpipe", 4, {}},
      {pipe2_tensor2, ParallelMode::Tp, "1f1b", 2, {}},
      {pipe2_tensor2, ParallelMode::Tp, "gpipe", 3, {}},
      {pipe2_data2_tensor2, ParallelMode::FsdpTp, "1f1b", 2, {}},
      // (The tensor cases run 2-3 micro-batches: a tensor split regroups the sums over heads and d_ff
      // that one process adds at once, which the same ill-conditioned entries below feel. With 4,
      // Llama's layer-0 q_proj and w1 end 8.9e-5 and 1.3e-4 from one process under pipe=2 x tensor=2
      // tp 1F1B, and GPT-2 untied drifts 1.2e-5 in one parameter under fsdp_tp GPipe with 3.)
      {pipe2_data2_tensor2, ParallelMode::FsdpTp, "gpipe", 2, {}},
      {pipe4_data2, ParallelMode::Fsdp, "1f1b", 3, {}},  // eight ranks: four stages of a two-rank fsdp mesh, M < P
      {pipe4_data2, ParallelMode::Dp, "gpipe", 4, {}},
      {pipe2_data2, ParallelMode::Dp, "1f1b", 4, {}, models::Recompute::Full},  // blocks run again in the backward
      {pipe2_data2, ParallelMode::Fsdp, "gpipe", 3, {}, models::Recompute::Full},
      {pipe2, ParallelMode::Dp, "gpipe", 2, {}, models::Recompute::Selective},
      {pipe2_tensor2, ParallelMode::Tp, "1f1b", 3, {}, models::Recompute::Selective},
  };
  // The reference of a case whose data ranks split the batch groups each micro-batch's rows as they do
  // (train_single's row_groups). Not a tolerance: the plain one process is that far from itself. With
  // 4 micro-batches, one element of Llama's layer-0 w1 ([33, 27]) has a gradient of -1.1e-7 and 1.4e-8
  // in steps 1 and 2 (its row's others are ~1e-3): below the rounding of its own sum over 64 token
  // rows, so any regrouping of that sum changes it by ~10%, and AdamW's first steps, which divide by
  // sqrt(v) ~ |g|, turn that into ~7% of lr. So the reference also adds the gradients in the data ranks'
  // order (each group's over the micro-batches, then the groups'): dp through the stages then equals it
  // bit for bit. Against a reference that interleaved the groups' sums, the margin under 1e-5 depended
  // on the CPU's rounding (1.5e-5 on a Zen 5). docs/mesh.md, "The pipe axis".
  std::map<std::pair<int, int64_t>, TrainRun> refs;
  auto ref_of = [&](int micro, int64_t groups) -> const TrainRun& {
    if (!refs.count({micro, groups})) refs[{micro, groups}] = train_single(arch, micro, groups);
    return refs[{micro, groups}];
  };
  // How far one process's parameters are from themselves when only the grouping of its sums over the
  // rows changes (all 8 rows at once, or 4 + 4): its rounding, grown by 20 steps of training. A schedule
  // that sums in another order is allowed twice that per element where it exceeds 1e-5: fsdp (which
  // reduce-scatters each micro-batch's gradient, not bit for bit one process) at the ill-conditioned
  // entries above, e.g. Llama's layer-0 w1 at 1.7e-5 where one process moves 8.5e-5 (a Zen 5).
  auto noise_of = [&](int micro) {
    const TrainRun &plain = ref_of(micro, 1), &grouped = ref_of(micro, 2);
    test::RoundingNoise noise;
    for (const auto& [name, values] : plain.params) {
      auto& n = noise.params[name];
      for (size_t i = 0; i < values.size(); ++i) n.push_back(2 * std::abs(values[i] - grouped.params.at(name)[i]));
    }
    return noise;
  };
  for (const Case& k : cases) {
    const int64_t groups = dist::batch_slices(k.mesh, k.mode);
    const TrainRun& ref = ref_of(k.micro, groups);
    EXPECT_TRUE(std::any_of(ref.norms.begin(), ref.norms.end(), [](double n) { return n > kClip; }));
    EXPECT_LT(ref.losses.back(), ref.losses.front());
    SCOPED_TRACE(k.schedule + " on " + k.mesh.str() + ", " + std::to_string(k.micro) + " micro-batches, recompute " +
                 models::recompute_name(k.recompute));
    const TrainRun got = train_pipelined(arch, k.mesh, k.mode, k.schedule, k.micro, k.bounds, k.recompute);
    test::expect_run_equivalent(ref, got, noise_of(k.micro));
    // Rank 0 (stage 0) sends each micro-batch's activations [b, T, C] once per step, nothing else.
    const int64_t rows = k.mode == ParallelMode::Tp ? kBatch : kBatch / k.mesh.data;
    EXPECT_EQ(got.send_bytes, int64_t{kSteps} * k.micro * rows * kSeq * 32 * 4);
    EXPECT_EQ(got.peak_in_flight,
              k.schedule == "gpipe" ? k.micro : std::min<int64_t>(k.mesh.pipe, k.micro));
  }
  // What the grouping alone does in one process (informational: it depends on the kernels' rounding).
  const TrainRun &plain = ref_of(4, 1), &grouped = ref_of(4, 2);
  float worst = 0;
  std::string where;
  for (const auto& [name, values] : plain.params) {
    for (size_t i = 0; i < values.size(); ++i) {
      const float d = std::abs(grouped.params.at(name)[i] - values[i]);
      if (d > worst) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  std::printf("%s, 4 micro-batches: one process with the rows summed 4 + 4 ends %.2g from one summing 8 (at %s)\n",
              arch.c_str(), worst, where.c_str());
}

// Interleaved 1F1B: two chunks per rank (4 blocks, 4 virtual stages on pipe=2), alone and with data,
// fsdp and tensor inside the stages.
TEST_P(PipeEquivalence, InterleavedMatchesOneProcess) {
  const std::string arch = GetParam();
  struct Case {
    Mesh mesh;
    ParallelMode mode;
    int micro;
  };
  const std::vector<Case> cases = {
      {Mesh::parse("pipe=2"), ParallelMode::Dp, 4},
      {Mesh::parse("pipe=2"), ParallelMode::Dp, 2},  // M = P: the warm-up covers every forward
      {Mesh::parse("pipe=2,data=2"), ParallelMode::Dp, 4},
      {Mesh::parse("pipe=2,data=2"), ParallelMode::Fsdp, 2},
      {Mesh::parse("pipe=2,tensor=2"), ParallelMode::Tp, 2},
  };
  std::map<std::pair<int, int64_t>, TrainRun> refs;
  for (const Case& k : cases) {
    const int64_t groups = dist::batch_slices(k.mesh, k.mode);
    if (!refs.count({k.micro, groups})) refs[{k.micro, groups}] = train_single(arch, k.micro, groups);
    const TrainRun& ref = refs[{k.micro, groups}];
    SCOPED_TRACE("interleaved x 2 on " + k.mesh.str() + " " + dist::parallel_mode_name(k.mode) + ", " +
                 std::to_string(k.micro) + " micro-batches");
    const TrainRun got = train_pipelined(arch, k.mesh, k.mode, "interleaved", k.micro, {}, models::Recompute::None, 2);
    test::expect_run_equivalent(ref, got);
    // Rank 0 runs virtual stages 0 and 2: it sends both chunks' activations and chunk 1's input gradient
    // (to rank 1's stage 1), each [b, T, C], for every micro-batch: 3 messages where 1F1B sends 1.
    const int64_t rows = k.mode == ParallelMode::Tp ? kBatch : kBatch / k.mesh.data;
    EXPECT_EQ(got.send_bytes, int64_t{kSteps} * 3 * k.micro * rows * kSeq * 32 * 4);
  }
  // Validation through the chunks (dist::pipeline_loss): rank 0's chunk 0, rank 1's, rank 0's chunk 1,
  // rank 1's, which ends with the loss, on every rank.
  const Mesh pipe2 = Mesh::parse("pipe=2");
  auto [ids, targets] = batch_of(0);
  const double whole = build(arch)->loss(ids, targets).item();
  dist::run_in_process(2, [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{pipe2, ParallelMode::Dp, &comm, rank});
    ctx->pipe_schedule = "interleaved";
    ctx->pipe_chunks = 2;
    auto model = build(arch);
    dist::shard_model(*model, ctx);
    EXPECT_EQ(ctx->pipe_bounds, (std::vector<int64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(dist::pipeline_loss(*model, ids, targets, *ctx), whole) << "rank " << rank;
  });
  // Errors name the values.
  auto error_of = [&](const char* mesh, int micro) {
    try {
      train_pipelined(arch, Mesh::parse(mesh), ParallelMode::Dp, "interleaved", micro, {}, models::Recompute::None, 2);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("pipe=2", 3).find("training.grad_accum_steps=3 is not a multiple of it"), std::string::npos)
      << error_of("pipe=2", 3);
  EXPECT_NE(error_of("pipe=4", 4).find("pipe=4 x virtual_stages=2 needs at least as many blocks, but the model has 4"),
            std::string::npos) << error_of("pipe=4", 4);
}

INSTANTIATE_TEST_SUITE_P(Families, PipeEquivalence, ::testing::Values("llama", "gpt2", "gpt2_untied"));

// DeepSeek-V3 through the stages: 3 blocks (1 dense, 2 MoE of 4 routed experts), one MTP module (which
// reads the token table on the last stage: tied with the first), the sequence balance loss computed on
// the stages that hold MoE layers, and the aux-loss-free bias updates from loads summed over the stages.
// Every step's loss, the parameters, and every routing bias on every rank after every step equal one
// process's (the biases bitwise).
namespace {

constexpr int64_t kDsBatch = 8, kDsSeq = 16, kDsVocab = 512;

std::unique_ptr<deepseek_v3::DeepSeekV3> build_dsv3(int64_t layers = 3) {
  const deepseek_v3::Config c{.vocab_size = kDsVocab, .context_length = 32, .d_model = 32, .num_layers = layers,
                              .n_dense = 1, .num_heads = 2, .q_rank = 16, .kv_rank = 8, .d_nope = 8, .d_rope = 4,
                              .d_v = 8, .d_ff = 64, .n_shared = 1, .n_routed = 4, .top_k = 2, .d_expert = 16,
                              .gamma = 1e-3f, .alpha_seq = 1e-4f, .n_mtp = 1};
  return std::make_unique<deepseek_v3::DeepSeekV3>(c, 11);
}

std::pair<Tensor, Tensor> ds_batch(int index) { return test::synthetic_batch(index % 5, kDsBatch, kDsSeq, kDsVocab); }

// lr 1e-3, as the other families. (These tests once ran at 3e-4, after one token-table entry drifted
// 1.2e-5 at 5e-4 under dp GPipe on pipe=2 x data=2; on today's code every case below, including
// those with 4 micro-batches, stays within 1e-5 at 1e-3.)
train::AdamWOptions ds_adamw() { return {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

struct DsRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> biases;  // after every step, both MoE layers' biases back to back
  test::WholeParameters params;
};

std::vector<float> biases_of(const deepseek_v3::DeepSeekV3& m) {
  std::vector<float> out;
  for (auto* moe : m.moe_layers()) {
    auto b = moe->bias.to_vector<float>();
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

models::ForwardContext ds_ctx(int s, int m, models::Recompute recompute = models::Recompute::None) {
  return models::ForwardContext::train(RngKey::from_seed(1).fold_in(static_cast<uint64_t>(s)).fold_in(static_cast<uint64_t>(m)),
                                       recompute);
}

DsRun ds_single(int micro, int64_t layers = 3) {
  DsRun run;
  auto model = build_dsv3(layers);
  auto params = model->parameters();
  train::AdamW opt(params, ds_adamw());
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    model->begin_training_step();
    double sum = 0;
    for (int m = 0; m < micro; ++m) {
      auto [ids, targets] = ds_batch(s * micro + m);
      Tensor loss = model->loss(ids, targets, ds_ctx(s, m));
      sum += loss.item();
      (micro > 1 ? ops::scale(loss, 1.0f / static_cast<float>(micro)) : loss).backward();
    }
    train::clip_grad_norm(train::gradients_of(params), kClip);
    opt.step();
    model->end_training_step(true);
    run.losses.push_back(sum / micro);
    run.biases.push_back(biases_of(*model));
  }
  for (nn::Parameter* p : params) run.params[p->name] = p->value.to_vector<float>();
  return run;
}

DsRun ds_pipelined(const Mesh& mesh, ParallelMode mode, const std::string& schedule, int micro,
                   models::Recompute recompute, int64_t chunks = 1, int64_t layers = 3) {
  DsRun run;
  std::vector<std::vector<std::vector<float>>> rank_biases(static_cast<size_t>(mesh.size()));
  dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{mesh, mode, &comm, rank});
    ctx->pipe_schedule = schedule;
    ctx->pipe_chunks = chunks;
    auto model = build_dsv3(layers);
    auto layout = dist::shard_model(*model, ctx);
    auto params = model->parameters();
    train::AdamW opt(params, ds_adamw());
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      model->begin_training_step();
      std::vector<dist::MicroBatch> batches;
      for (int m = 0; m < micro; ++m) {
        auto [ids, targets] = ds_batch(s * micro + m);
        batches.push_back({dist::local_batch(ids, *ctx), dist::local_batch(targets, *ctx), ds_ctx(s, m, recompute)});
      }
      const double sum = dist::pipeline_step(*model, params, batches, *ctx);
      dist::finish_gradients(params, *ctx);
      dist::finish_pipe_gradients(params, *ctx);
      dist::clip_grad_norm(params, layout, *ctx, kClip);
      opt.step();
      model->end_training_step(true);
      rank_biases[static_cast<size_t>(rank)].push_back(biases_of(*model));
      if (rank == 0) run.losses.push_back(sum / micro);
    }
    test::gather_parameters(params, *ctx, run.params);
  });
  run.biases = rank_biases[0];
  for (const auto& b : rank_biases) EXPECT_EQ(b, run.biases) << "the ranks' routing biases differ";
  return run;
}

}  // namespace

TEST(PipeDeepSeek, MtpBalanceLossAndBiasUpdatesMatchOneProcess) {
  set_num_threads(1);
  struct Case {
    std::string mesh;
    ParallelMode mode;
    std::string schedule;
    int micro;
    models::Recompute recompute = models::Recompute::None;
  };
  // Each mode inside the stages under both schedules; the reference never recomputes (recomputation
  // gives the same bits).
  const std::vector<Case> cases = {
      {"pipe=2", ParallelMode::Dp, "1f1b", 2},
      {"pipe=3", ParallelMode::Dp, "gpipe", 3},
      {"pipe=2,data=2", ParallelMode::Dp, "1f1b", 4},
      {"pipe=2,data=2", ParallelMode::Dp, "gpipe", 2},
      {"pipe=2,data=2", ParallelMode::Fsdp, "1f1b", 4},
      {"pipe=2,data=2", ParallelMode::Fsdp, "gpipe", 3},
      {"pipe=2,tensor=2", ParallelMode::Tp, "1f1b", 3},
      {"pipe=2,tensor=2", ParallelMode::Tp, "gpipe", 2},
      {"pipe=2,data=2,tensor=2", ParallelMode::FsdpTp, "1f1b", 2},
      {"pipe=2,data=2,tensor=2", ParallelMode::FsdpTp, "gpipe", 3},
      {"pipe=2,expert=2", ParallelMode::DpEp, "1f1b", 2},
      {"pipe=2,expert=2", ParallelMode::DpEp, "gpipe", 3},
      {"pipe=2,data=2,expert=2", ParallelMode::DpEp, "1f1b", 4},
      {"pipe=2,expert=2", ParallelMode::FsdpEp, "1f1b", 3},
      {"pipe=2,data=2,expert=2", ParallelMode::FsdpEp, "gpipe", 2},
      {"pipe=2,expert=2", ParallelMode::FsdpEp, "gpipe", 2, models::Recompute::Full},
      {"pipe=2,data=2", ParallelMode::Dp, "1f1b", 3, models::Recompute::Selective},
  };
  std::map<int, DsRun> refs;
  for (const Case& k : cases) {
    if (!refs.count(k.micro)) refs[k.micro] = ds_single(k.micro);
    const DsRun& ref = refs[k.micro];
    EXPECT_NE(ref.biases.front(), ref.biases.back());  // the biases moved
    SCOPED_TRACE(std::string(dist::parallel_mode_name(k.mode)) + " " + k.schedule + " on " + k.mesh + ", " +
                 std::to_string(k.micro) + " micro-batches, recompute " + models::recompute_name(k.recompute));
    const DsRun got = ds_pipelined(Mesh::parse(k.mesh), k.mode, k.schedule, k.micro, k.recompute);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "loss at step " << s + 1;
      EXPECT_EQ(got.biases[s], ref.biases[s]) << "routing biases after step " << s + 1;
    }
    test::expect_parameters_near(ref.params, got.params);
  }
}

// DeepSeek-V3 under interleaved 1F1B: 4 blocks (1 dense, 3 MoE) as 4 virtual stages on pipe=2, so each
// rank holds MoE blocks of two chunks (balance-loss terms and expert loads from both) and the MTP module
// on the last chunk of rank 1 reads the token table of rank 0's first.
TEST(PipeDeepSeek, InterleavedMatchesOneProcess) {
  set_num_threads(1);
  struct Case {
    std::string mesh;
    ParallelMode mode;
    int micro;
  };
  const std::vector<Case> cases = {
      {"pipe=2", ParallelMode::Dp, 2},
      {"pipe=2,data=2", ParallelMode::Dp, 4},
      {"pipe=2,data=2", ParallelMode::Fsdp, 2},
      {"pipe=2,expert=2", ParallelMode::DpEp, 2},
  };
  std::map<int, DsRun> refs;
  for (const Case& k : cases) {
    if (!refs.count(k.micro)) refs[k.micro] = ds_single(k.micro, 4);
    const DsRun& ref = refs[k.micro];
    EXPECT_NE(ref.biases.front(), ref.biases.back());
    SCOPED_TRACE(std::string(dist::parallel_mode_name(k.mode)) + " interleaved x 2 on " + k.mesh + ", " +
                 std::to_string(k.micro) + " micro-batches");
    const DsRun got = ds_pipelined(Mesh::parse(k.mesh), k.mode, "interleaved", k.micro, models::Recompute::None, 2, 4);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "loss at step " << s + 1;
      EXPECT_EQ(got.biases[s], ref.biases[s]) << "routing biases after step " << s + 1;
    }
    test::expect_parameters_near(ref.params, got.params);
  }
}
