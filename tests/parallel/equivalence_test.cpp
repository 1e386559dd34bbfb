// Sharded training equals single-process training: 20 AdamW steps (clipping on) of tiny Llama and GPT-2
// models in every mode on several meshes, with the in-process communicator, against one process on the
// same global batches: losses within 1e-5 relative, every parameter within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/autograd.h"
#include "core/parallel.h"
#include "parallel/runtime.h"
#include "models/gpt2/model.h"
#include "models/llama/model.h"
#include "ops/elementwise.h"
#include "ops/shape.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "support/equivalence.h"
#include "support/synthetic_batch.h"

using namespace loom;
using dist::Mesh;
using dist::ParallelMode;

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 8, kSeq = 8, kVocab = 64;
constexpr double kClip = 0.5;

std::unique_ptr<models::LanguageModel> build(const std::string& arch, bool bf16 = false) {
  if (arch == "llama") {
    const llama::Config c{.vocab_size = kVocab, .context_length = 16, .d_model = 32, .num_layers = 2, .num_heads = 8,
                          .num_kv_heads = 4, .d_ff = 64};
    auto model = std::make_unique<llama::TransformerLM>(c, 7);
    if (bf16) model->set_matmul_precision(ops::MatmulPrecision::BF16);
    return model;
  }
  const gpt2::Config c{.vocab_size = kVocab, .context_length = 16, .d_model = 32, .num_layers = 2, .num_heads = 8,
                       .tie_embeddings = arch == "gpt2",  // "gpt2_untied" has its own lm_head
                       .dropout = 0};
  return std::make_unique<gpt2::GPT2>(c, 7);
}

// The global batch of a step: ids and next-token targets from a fixed integer hash.
std::pair<Tensor, Tensor> batch_of(int step) { return loom::test::synthetic_batch(step, kBatch, kSeq, kVocab); }

// lr 1e-3: GPT-2's key bias has a mathematically zero gradient (q.b_k is the same for every key, and
// softmax ignores a constant), so its "gradient" is rounding noise that AdamW normalises into lr-sized
// steps in any implementation; at 3e-3 that noise alone drifts those biases by ~1.5e-5 in 20 steps.
train::AdamWOptions adamw() { return {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

struct TrainRun {
  std::vector<double> losses, norms;
  test::WholeParameters params;  // whole tensors after the last step
  int64_t started = 0;                               // collectives rank 0 started in the background
};

// How a sharded run communicates: overlapped or not, its gradient buckets, micro-batches per step (each
// micro-batch m of step s reads batch_of(s * micro + m)).
struct Schedule {
  bool overlap = true;
  int64_t bucket_bytes = int64_t{256} << 10;
  int micro = 1;
  int steps = kSteps;
  bool bf16 = false;  // a Llama in mixed precision
};

TrainRun train_single(const std::string& arch, bool bf16 = false, int steps = kSteps) {
  TrainRun run;
  auto model = build(arch, bf16);
  auto params = model->parameters();
  train::AdamW opt(params, adamw());
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto [ids, targets] = batch_of(s);
    Tensor loss = model->loss(ids, targets);
    run.losses.push_back(loss.item());
    loss.backward();
    run.norms.push_back(train::clip_grad_norm(train::gradients_of(params), kClip));
    opt.step();
  }
  for (nn::Parameter* p : params) run.params[p->name] = p->value.to_vector<float>();
  return run;
}

TrainRun train_sharded(const std::string& arch, const Mesh& mesh, ParallelMode mode, const Schedule& how = {}) {
  TrainRun run;
  dist::run_in_process(static_cast<int>(mesh.size()), [&](int rank, dist::Communicator& comm) {
    auto ctx = std::make_shared<dist::RankContext>(
        dist::RankContext{mesh, mode, &comm, rank, how.overlap, how.bucket_bytes});
    auto model = build(arch, how.bf16);
    auto layout = dist::shard_model(*model, ctx);
    auto params = model->parameters();
    train::AdamW opt(params, adamw());
    for (int s = 0; s < how.steps; ++s) {
      opt.zero_grad();
      double global = 0;
      for (int m = 0; m < how.micro; ++m) {
        auto [ids, targets] = batch_of(s * how.micro + m);
        Tensor loss = model->loss(dist::local_batch(ids, *ctx), dist::local_batch(targets, *ctx));
        global += dist::global_loss(loss.item(), *ctx) / how.micro;
        dist::backward(how.micro > 1 ? ops::scale(loss, 1.0f / static_cast<float>(how.micro)) : loss, params, *ctx,
                       m + 1 == how.micro);
      }
      dist::finish_gradients(params, *ctx);
      const double norm = dist::clip_grad_norm(params, layout, *ctx, kClip);
      opt.step();
      if (rank == 0) {
        run.losses.push_back(global);
        run.norms.push_back(norm);
      }
    }
    if (rank == 0) run.started = comm.stats.started;
    test::gather_parameters(params, *ctx, run.params);
  });
  return run;
}

class Equivalence : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }  // one thread per rank; results do not depend on it
};

}  // namespace

TEST_P(Equivalence, EveryModeMatchesOneProcess) {
  const std::string arch = GetParam();
  const TrainRun ref = train_single(arch);
  // The test must exercise clipping and learning: some step clipped, and the loss went down.
  EXPECT_TRUE(std::any_of(ref.norms.begin(), ref.norms.end(), [](double n) { return n > kClip; }));
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  const std::vector<std::pair<Mesh, ParallelMode>> cases = {
      {{2, 1}, ParallelMode::Dp},    {{4, 1}, ParallelMode::Fsdp},  {{1, 2}, ParallelMode::Tp},
      {{1, 4}, ParallelMode::Tp},    {{2, 2}, ParallelMode::FsdpTp}, {{4, 2}, ParallelMode::FsdpTp},
  };
  for (const auto& [mesh, mode] : cases) {
    SCOPED_TRACE(std::string(dist::parallel_mode_name(mode)) + " on " + mesh.str());
    test::expect_run_equivalent(ref, train_sharded(arch, mesh, mode));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Equivalence, ::testing::Values("llama", "gpt2", "gpt2_untied"));

// bf16 mixed precision through the sharded layers. Unsharded, a bf16 Llama's norms write bf16 outputs
// for the GEMMs; a sharded reader gets f32 instead (fsdp_linear's backward multiplies its saved input
// in f32, and would refuse a bf16 one), so every mode trains, and tracks the one-process bf16 run as
// closely as bf16 rounding allows (the sharded backward's f32 GEMMs round less than one process's).
TEST(EquivalenceBf16, LlamaTrainsInEveryModeAndTracksOneProcess) {
  set_num_threads(1);
  const TrainRun ref = train_single("llama", /*bf16=*/true, 5);
  const std::vector<std::pair<Mesh, ParallelMode>> cases = {
      {{2, 1}, ParallelMode::Dp}, {{2, 1}, ParallelMode::Fsdp}, {{1, 2}, ParallelMode::Tp}, {{2, 2}, ParallelMode::FsdpTp}};
  for (const auto& [mesh, mode] : cases) {
    SCOPED_TRACE(std::string(dist::parallel_mode_name(mode)) + " on " + mesh.str());
    Schedule how;
    how.steps = 5;
    how.bf16 = true;
    const TrainRun got = train_sharded("llama", mesh, mode, how);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      ASSERT_TRUE(std::isfinite(got.losses[s])) << "step " << s + 1;
      EXPECT_NEAR(got.losses[s], ref.losses[s], 0.01) << "loss at step " << s + 1;
    }
  }
}

// Overlapping communication with compute changes when collectives run, never what they add or in which
// order: every loss, gradient norm and parameter is bitwise the same with it on and off. Small buckets
// so that dp starts several all-reduces during backward; two micro-batches in one case (only the last
// backward starts all-reduces); 5 steps, so the prefetch orders learned in step 1 run in steps 2-5.
TEST(Overlap, ResultsAreBitwiseTheSameWithAndWithout) {
  set_num_threads(1);
  struct Case {
    std::string arch;
    Mesh mesh;
    ParallelMode mode;
    int micro;
  };
  const std::vector<Case> cases = {
      {"llama", {2, 1}, ParallelMode::Dp, 2},   {"llama", {4, 1}, ParallelMode::Fsdp, 1},
      {"llama", {2, 2}, ParallelMode::FsdpTp, 1}, {"gpt2", {2, 1}, ParallelMode::Fsdp, 2},
      {"gpt2_untied", {2, 1}, ParallelMode::Dp, 1},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.arch + " " + dist::parallel_mode_name(k.mode) + " on " + k.mesh.str());
    const TrainRun on = train_sharded(k.arch, k.mesh, k.mode, {true, 4096, k.micro, 5});
    const TrainRun off = train_sharded(k.arch, k.mesh, k.mode, {false, 4096, k.micro, 5});
    EXPECT_GT(on.started, 0) << "nothing was overlapped";
    if (k.arch == "llama" && k.mode == ParallelMode::Fsdp) {
      // 14 FSDP Linears (2 layers x q, k, v, output_proj, w1, w2, w3). Step 1 learns the order: each
      // Linear gathered alone (blocking) and its gradient reduce-scattered alone in the background. From
      // step 2 on, each pass gathers its 2 blocks in one started collective each (the second prefetched
      // while the first computes) and the backward reduce-scatters each block's 7 gradients in one.
      // The data-axis buckets come on top; a Linear on its own would make it 5 x 14 and more.
      EXPECT_GE(on.started, 14 + 4 * (2 + 2 + 2)) << "the blocks were not gathered in the background";
      EXPECT_LT(on.started, 5 * 14) << "the blocks' Linears were not gathered and reduce-scattered together";
      std::printf("llama fsdp on %s: %lld collectives started in the background in 5 steps\n", k.mesh.str().c_str(),
                  static_cast<long long>(on.started));
    }
    EXPECT_EQ(off.started, 0);
    ASSERT_EQ(on.losses.size(), off.losses.size());
    for (size_t i = 0; i < on.losses.size(); ++i) {
      EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
      EXPECT_EQ(on.norms[i], off.norms[i]) << "step " << i + 1;
    }
    for (const auto& [name, values] : off.params) EXPECT_EQ(on.params.at(name), values) << name;
  }
}

// A pass that stops before its order's last Linear (an evaluation skips DeepSeek-V3's MTP module, which
// the training forward's order ends with) leaves no gathered block for the next pass: after the shards
// change, the next training forward computes with the new weights, as without overlap.
TEST(Overlap, APassThatStopsEarlyLeavesNoStaleBlock) {
  set_num_threads(1);
  const models::ModelConfig mc =
      train::TrainConfig::load("dsv3-tiny", {"model.n_mtp=1", "model.num_layers=1", "model.context_length=16"}).model;
  auto run = [&](bool overlap) {
    float after = 0;
    dist::run_in_process(2, [&](int rank, dist::Communicator& comm) {
      auto ctx = std::make_shared<dist::RankContext>(dist::RankContext{{2, 1, 1}, ParallelMode::Fsdp, &comm, rank, overlap});
      auto model = mc.build(5);
      dist::shard_model(*model, ctx);
      auto params = model->parameters();
      std::vector<int32_t> ids(4 * 17);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((7 * i + 3) % mc.vocab_size());
      const Tensor all = Tensor::from_vector<int32_t>({4, 17}, ids);
      const Tensor x = dist::local_batch(ops::narrow(all, 1, 0, 16), *ctx);
      const Tensor y = dist::local_batch(ops::narrow(all, 1, 1, 16), *ctx);
      for (int step = 0; step < 2; ++step) {  // the orders are learned, then followed
        dist::backward(model->loss(x, y, models::ForwardContext::train(RngKey::from_seed(1))), params, *ctx);
        dist::finish_gradients(params, *ctx);
        for (nn::Parameter* p : params) p->value.set_grad(Tensor());
      }
      {
        autograd::NoGradGuard no_grad;
        model->loss(x, y);  // evaluation: the main layers only
      }
      for (nn::Parameter* p : params) {  // the shards change (as a load would)
        float* v = p->value.data<float>();
        for (int64_t i = 0; i < p->value.numel(); ++i) v[i] += 0.01f;
        p->value_changed();
      }
      Tensor loss = model->loss(x, y, models::ForwardContext::train(RngKey::from_seed(1)));
      if (rank == 0) after = loss.item();
      dist::backward(loss, params, *ctx);
      dist::finish_gradients(params, *ctx);
    });
    return after;
  };
  EXPECT_EQ(run(true), run(false));
}
