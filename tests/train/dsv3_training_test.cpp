// DeepSeek-V3 in the trainer: aux-loss-free balancing after each optimizer step (the seed's
// update_bias, not a gradient), the routing biases as model state in weights files and checkpoints,
// the family's metrics in metrics.jsonl, and bitwise-exact runs and resumes with all of it on.
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "models/deepseek_v3/model.h"
#include "support/op_test.h"
#include "support/synthetic_corpus.h"
#include "train/config.h"
#include "train/metrics.h"
#include "runs/load.h"
#include "train/trainer.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

deepseek_v3::Config tiny_config() {
  return deepseek_v3::Config::from_json(train::TrainConfig::load("dsv3-tiny").model.json());
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(random_bits(RngKey::from_seed(seed), static_cast<uint64_t>(i)) % V);
  }
  return t;
}

struct TempDir : test::SyntheticCorpusDir {
  TempDir() : SyntheticCorpusDir("loom_dsv3_training_test") {}
  train::TrainConfig config(int64_t steps, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> o = {
        "model.vocab_size=64", "training.max_steps=" + std::to_string(steps), "training.batch_size=4",
        "model.context_length=16", "schedule.warmup_steps=5", "schedule.cosine_steps=40", "eval.interval=10",
        "eval.batches=2", "logging.interval=5", "logging.progress=none", "logging.peak_flops=1e11",
        "training.threads=1", "checkpoint.interval=10", "checkpoint.keep_last=2", "sample.num_samples=0",
        "model.gamma=0.01",  // large enough that a few steps move the biases visibly
        "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\"",
        "data.tokenizer=\"" + (dir / "no_tokenizer.json").string() + "\""};
    o.insert(o.end(), extra.begin(), extra.end());
    return train::TrainConfig::load("dsv3-tiny", o);
  }
};

std::vector<float> biases_of(const models::LanguageModel& m) {
  std::vector<float> out;
  for (const auto& [name, t] : m.state_tensors()) {
    auto v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST(Dsv3Training, TheBiasMovesByGammaTimesTheSignOfMeanLoadMinusLoadOverTheStepsMicroBatches) {
  deepseek_v3::Config c = tiny_config();
  c.gamma = 0.25f;
  deepseek_v3::DeepSeekV3 model(c, 7);
  deepseek_v3::MoE* moe = model.moe_layers().at(0);
  moe->bias.data<float>()[1] = 0.5f;  // a nonzero start: the update adds to it
  const std::vector<float> before = moe->bias.to_vector<float>();
  Tensor a = random_ids(2, 12, c.vocab_size, 1), b = random_ids(2, 12, c.vocab_size, 2);

  // The loads the update must use: both micro-batches of the step, with the bias as it was.
  std::vector<int64_t> counts(static_cast<size_t>(c.n_routed), 0);
  for (const Tensor& ids : {a, b}) {
    auto l = model.losses(ids, ids);
    for (int64_t e = 0; e < c.n_routed; ++e) counts[static_cast<size_t>(e)] += l.expert_load[0].data<int32_t>()[e];
  }
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  EXPECT_EQ(total, 2 * a.numel() * c.top_k);

  model.begin_training_step();
  const auto ctx = models::ForwardContext::train(RngKey::from_seed(3));
  model.loss(a, a, ctx);
  model.loss(b, b, ctx);
  EXPECT_EQ(moe->bias.to_vector<float>(), before) << "the bias moves only after the optimizer step";
  model.end_training_step(/*applied=*/true);
  const std::vector<float> after = moe->bias.to_vector<float>();
  int moved = 0;
  for (int64_t e = 0; e < c.n_routed; ++e) {
    const double mean = static_cast<double>(total) / static_cast<double>(c.n_routed);
    const double load = static_cast<double>(counts[static_cast<size_t>(e)]);
    const float sign = mean > load ? 1.0f : mean < load ? -1.0f : 0.0f;
    EXPECT_EQ(after[static_cast<size_t>(e)], before[static_cast<size_t>(e)] + c.gamma * sign) << "expert " << e;
    moved += sign != 0;
  }
  EXPECT_GT(moved, 0);

  // A skipped step (non-finite) moves nothing, and its loads do not leak into the next step.
  model.begin_training_step();
  model.loss(a, a, ctx);
  model.end_training_step(/*applied=*/false);
  EXPECT_EQ(moe->bias.to_vector<float>(), after);
  model.begin_training_step();
  model.end_training_step(/*applied=*/true);  // no micro-batch: no loads, nothing moves
  EXPECT_EQ(moe->bias.to_vector<float>(), after);

  // The metrics window saw three training micro-batches.
  nlohmann::json m = model.take_training_metrics();
  ASSERT_TRUE(m.contains("mtp_loss") && m.contains("main_loss") && m.contains("balance_loss")) << m.dump();
  ASSERT_EQ(m["expert_load_min"].size(), 1u);
  EXPECT_LE(m["expert_load_min"][0].get<double>(), 1.0 / static_cast<double>(c.n_routed));
  EXPECT_GE(m["expert_load_max"][0].get<double>(), 1.0 / static_cast<double>(c.n_routed));
  EXPECT_EQ(m["bias_max"][0].get<float>(), *std::max_element(after.begin(), after.end()));
  EXPECT_FALSE(model.take_training_metrics().contains("main_loss")) << "the window resets";
}

TEST(Dsv3Training, RoutingBiasesAreSavedWithTheWeightsAndRestoredExactly) {
  deepseek_v3::DeepSeekV3 model(tiny_config(), 5);
  float* b = model.moe_layers().at(0)->bias.data<float>();
  for (int e = 0; e < 4; ++e) b[e] = 0.1f * static_cast<float>(e) - 0.013f;
  TempDir tmp;
  const std::string path = (tmp.dir / "model.safetensors").string();
  runs::save_model_weights(model, path);
  auto loaded = runs::load_model_weights(path);
  EXPECT_EQ(biases_of(*loaded), biases_of(model));
  EXPECT_EQ(loaded->parameters().size(), model.parameters().size());
  // Not a parameter: the optimizer never sees it.
  for (nn::Parameter* p : loaded->parameters()) EXPECT_EQ(p->name.find(".moe.bias"), std::string::npos);
  EXPECT_THROW(loaded->load_state("layers.0.moe.bias", Tensor::zeros({4})), Error);  // layer 0 is dense
  EXPECT_THROW(loaded->load_state("layers.1.moe.bias", Tensor::zeros({5})), Error);  // wrong shape
}

TEST(Dsv3Training, RunsAndResumesAreBitwiseIdenticalBiasesAndMtpIncluded) {
  TempDir tmp;
  const std::vector<std::string> accum = {"training.grad_accum_steps=2"};
  const fs::path a = tmp.dir / "a", b = tmp.dir / "b", c = tmp.dir / "c";
  train::Trainer whole(tmp.config(30, accum), a.string());
  whole.run();
  {
    train::Trainer first(tmp.config(20, accum), b.string());
    first.run();
  }
  train::Trainer second(tmp.config(30, accum), b.string());
  ASSERT_EQ(second.resume(), std::optional<int64_t>(20));
  second.run();

  // Every metrics line after the start (train and val), the biases and the weights: bitwise.
  auto events_a = train::read_metrics((a / "metrics.jsonl").string());
  auto events_b = train::read_metrics((b / "metrics.jsonl").string());
  auto strip = [](std::vector<nlohmann::json> ev) {
    for (auto& e : ev) {
      e.erase("tokens_per_s");
      e.erase("mfu");
    }
    return ev;
  };
  EXPECT_EQ(strip(events_a), strip(events_b));
  EXPECT_EQ(biases_of(whole.model()), biases_of(second.model()));
  for (nn::Parameter* p : whole.model().parameters()) {
    const Tensor& q = second.model().parameter(p->name).value;
    EXPECT_EQ(std::memcmp(p->value.raw_data(), q.raw_data(), p->value.nbytes()), 0) << p->name;
  }

  // The family's metrics are there, and the balancing really ran.
  int with_loads = 0;
  for (const auto& e : events_a) {
    if (e.value("event", "") != "train") continue;
    ASSERT_TRUE(e.contains("mtp_loss") && e.contains("balance_loss") && e.contains("expert_load_max") &&
                e.contains("bias_min"))
        << e.dump();
    EXPECT_GT(e["mtp_loss"].get<double>(), 0);
    ++with_loads;
  }
  EXPECT_EQ(with_loads, 6);
  const std::vector<float> biases = biases_of(whole.model());
  EXPECT_NE(*std::max_element(biases.begin(), biases.end()), *std::min_element(biases.begin(), biases.end()));

  // With gamma 0 the biases stay zero and the run differs.
  train::Trainer frozen(tmp.config(30, {"training.grad_accum_steps=2", "model.gamma=0"}), c.string());
  frozen.run();
  for (float v : biases_of(frozen.model())) EXPECT_EQ(v, 0.0f);
  EXPECT_NE(train::read_metrics((c / "metrics.jsonl").string()).back().dump(), events_a.back().dump());
}
