// `loom train` on a GPU (training.device = "cuda"): the trainer's loop, validation, checkpoints and
// resume with the parameters, moments and batches on cuda:0, against the same run on the CPU. The model
// tests (model_test.cpp) check one step's gradients; these check what the trainer adds: batches copied
// over, losses read back, moments saved from and loaded to the device, weights a CPU program loads.
// Skipped without a GPU (tools/device_check.sh runs them); the refusals hold on every machine.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "gpu_test.h"
#include "io/safetensors.h"
#include "runs/checkpoint.h"
#include "runs/load.h"
#include "support/files.h"
#include "support/synthetic_corpus.h"
#include "train/device.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace loom;
using namespace loom::test;
namespace fs = std::filesystem;

namespace {

struct Corpus : SyntheticCorpusDir {
  Corpus() : SyntheticCorpusDir("loom_cuda_trainer_test") {}
  // The tiny Llama (or GPT-2, or DeepSeek-V3) on the synthetic corpus: validation and a checkpoint every 6
  // steps; the cosine's length fixed, so that runs of 6 and 12 steps share their learning rates.
  train::TrainConfig config(const std::string& device, int64_t steps, const std::string& family = "llama") const {
    std::vector<std::string> sets = {"model.vocab_size=64", "training.max_steps=" + std::to_string(steps), "training.batch_size=4",
                 "model.context_length=32", "schedule.warmup_steps=2",
                 "schedule.cosine_steps=12", "eval.interval=6", "eval.batches=2",
                 "logging.interval=1", "logging.progress=none", "logging.peak_flops=1e11", "checkpoint.interval=6",
                 "checkpoint.keep_last=0", "training.device=" + device,
                 // No tokenizer (the presets name data/ ones, whose vocabularies are larger than 64).
                 "data.tokenizer=\"" + (dir / "no_tokenizer.json").string() + "\"",
                 "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\""};
    if (family == "gpt2") {  // LayerNorm, GELU, biases, a tied head and dropout 0.1, at tiny's sizes
      for (const char* s : {"model.d_model=64", "model.num_layers=2", "model.num_heads=4"}) sets.push_back(s);
    }
    const char* preset = family == "gpt2" ? "gpt2-austen" : family == "deepseek_v3" ? "dsv3-tiny" : "tiny";
    return train::TrainConfig::load(preset, sets);
  }
};

std::vector<double> metric_of(const fs::path& run, const std::string& event, const std::string& key) {
  std::vector<double> out;
  for (const auto& e : train::read_metrics((run / "metrics.jsonl").string())) {
    if (e.value("event", "") == event) out.push_back(e.at(key).get<double>());
  }
  return out;
}

void expect_tracks(const std::vector<double>& gpu, const std::vector<double>& cpu, double tolerance, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], tolerance * std::max(1.0, std::abs(cpu[i]))) << what << " " << i;
  }
}

}  // namespace

// The same run on cuda:0 and on the CPU, for each family: every step's loss and every validation loss
// track (the GEMMs sum in another order, so not bit for bit), the parameters stay on the GPU, and the
// final weights, written from the device, load into a CPU model whose loss is the run's.
TEST(CudaTrainer, TracksTheCpuRunForEveryFamily) {
  LOOM_REQUIRE_GPU();
  
  for (const std::string family : {"llama", "gpt2", "deepseek_v3"}) {
    SCOPED_TRACE(family);
    Corpus corpus;
    train::Trainer cpu(corpus.config("cpu", 12, family), (corpus.dir / "cpu").string());
    cpu.run();
    train::Trainer gpu(corpus.config("cuda", 12, family), (corpus.dir / "gpu").string());
    EXPECT_EQ(gpu.device(), kGpu);
    auto summary = gpu.run();
    EXPECT_EQ(summary.steps_completed, 12);
    EXPECT_EQ(summary.steps_skipped, 0);
    for (nn::Parameter* p : gpu.model().parameters()) EXPECT_EQ(p->value.device(), kGpu) << p->name;
    const auto gl = metric_of(corpus.dir / "gpu", "train", "loss"), cl = metric_of(corpus.dir / "cpu", "train", "loss");
    expect_tracks(gl, cl, 2e-3, "train loss");
    expect_tracks(metric_of(corpus.dir / "gpu", "val", "val_loss"), metric_of(corpus.dir / "cpu", "val", "val_loss"), 2e-3,
                  "val loss");
    ASSERT_EQ(gl.size(), 12u);
    EXPECT_LT(gl.back(), gl.front()) << "the loss should fall";

    gpu.save_weights((corpus.dir / "gpu.safetensors").string());
    auto host = runs::load_model_weights((corpus.dir / "gpu.safetensors").string());
    for (nn::Parameter* p : host->parameters()) {
      const nn::Parameter& q = gpu.model().parameter(p->name);
      EXPECT_EQ(p->value.to_vector<float>(), host_values(q.value)) << p->name << ": the saved weights are the GPU's";
    }
  }
}

// A checkpoint written from the GPU resumes exactly: 6 + 6 steps on the GPU give the same bits as 12
// steps straight (the kernels are deterministic: no atomics on floats), and the same checkpoint resumes on
// the CPU, whose losses then track the GPU's.
TEST(CudaTrainer, CheckpointsResumeOnTheGpuBitForBitAndOnTheCpu) {
  LOOM_REQUIRE_GPU();
  
  Corpus corpus;
  train::Trainer straight(corpus.config("cuda", 12), (corpus.dir / "straight").string());
  straight.run();

  train::Trainer first(corpus.config("cuda", 6), (corpus.dir / "split").string());
  first.run();
  auto checkpoint_of = [&](const char* run, int64_t step) {
    return fs::path(runs::checkpoints_dir((corpus.dir / run).string())) / runs::checkpoint_name(step);
  };
  const fs::path checkpoint = checkpoint_of("split", 6);
  ASSERT_TRUE(fs::exists(checkpoint / "optimizer.safetensors"));
  fs::copy(corpus.dir / "split", corpus.dir / "on_cpu", fs::copy_options::recursive);

  train::Trainer second(corpus.config("cuda", 12), (corpus.dir / "split").string());
  ASSERT_EQ(second.resume(), std::optional<int64_t>(6));
  for (nn::Parameter* p : second.model().parameters()) EXPECT_EQ(p->value.device(), kGpu) << p->name;
  second.run();
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string split = read_file(checkpoint_of("split", 12) / file);
    EXPECT_FALSE(split.empty()) << file;
    EXPECT_TRUE(split == read_file(checkpoint_of("straight", 12) / file)) << file << " differs";
  }

  train::Trainer on_cpu(corpus.config("cpu", 12), (corpus.dir / "on_cpu").string());
  ASSERT_EQ(on_cpu.resume(), std::optional<int64_t>(6));
  on_cpu.run();
  auto gl = metric_of(corpus.dir / "straight", "train", "loss"), cl = metric_of(corpus.dir / "on_cpu", "train", "loss");
  ASSERT_EQ(cl.size(), 12u);  // 6 from the GPU's first half, 6 resumed on the CPU
  expect_tracks(gl, cl, 2e-3, "train loss");
}

// bf16 mixed precision on the GPU (bf16 GEMM operands, f32 master weights) learns like the CPU's.
TEST(CudaTrainer, Bf16MixedPrecisionLearns) {
  LOOM_REQUIRE_GPU();
  
  Corpus corpus;
  auto config = corpus.config("cuda", 30);
  config.training.precision = "bf16";
  train::Trainer gpu(config, (corpus.dir / "gpu").string());
  auto summary = gpu.run();
  ASSERT_TRUE(summary.first_val_loss && summary.last_val_loss);
  EXPECT_LT(*summary.last_val_loss, *summary.first_val_loss - 0.5);
  EXPECT_EQ(gpu.model().parameter("lm_head.weight").value.dtype(), DType::F32);
}

// A GPU with a mesh of several ranks is refused, naming both (the mesh's communicators are MPI's on host
// memory for now); one rank is one process and fine.
TEST(CudaTrainer, AMeshOnAGpuIsRefused) {
  LOOM_REQUIRE_GPU();
  
  try {
    train::training_device("cuda", "data=2", "train");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 with the mesh 'data=2' (2 ranks)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(train::training_device("cuda:0", "data=1,tensor=1", "train"), kGpu);
}

// On every machine: the device is checked before anything is read or written, with the reason.
TEST(CudaTrainer, TheDeviceIsCheckedFirst) {
  EXPECT_EQ(train::training_device("cpu", "data=2", "train"), Device::cpu());
  try {
    train::training_device("tpu", "", "train");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tpu"), std::string::npos) << e.what();
  }
  if (cuda_available()) return;
  Corpus corpus;
  try {
    train::Trainer t(corpus.config("cuda", 2), (corpus.dir / "run").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train: cannot use cuda:0: " + cuda::unavailable_reason()), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(corpus.dir / "run"));
}
