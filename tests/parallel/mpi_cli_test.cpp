// `loom train` under mpirun (Open MPI): sharded runs equal one process, a sharded checkpoint resumes on
// another mesh and mode exactly, and a rank killed with kill -9 ends the job in bounded time.
// Skipped when this loom was built without MPI or mpirun is not on PATH. Each run trains the tiny preset
// (shrunk) on a synthetic corpus; flags for root and for more ranks than cores are passed explicitly.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "parallel/checkpoint.h"
#include "mesh/mpi.h"
#include "io/safetensors.h"
#include "support/synthetic_corpus.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

struct Corpus : test::SyntheticCorpusDir {
  Corpus() : SyntheticCorpusDir("loom_mpi_cli") {}

  // The command line of a run: `ranks` 0 runs loom alone, else under mpirun -np ranks.
  std::string command(int ranks, const fs::path& out, int64_t steps, const std::string& extra = "",
                      const std::string& preset = "tiny") const {
    std::string cmd = ranks > 0 ? "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " : "";
    cmd += std::string(LOOM_CLI) + " train --config " + preset + " --out " + out.string();
    for (const std::string& s : {std::string("model.vocab_size=64"), std::string("model.context_length=32"),
                                 std::string("training.batch_size=8"), std::string("training.threads=1"),
                                 "training.max_steps=" + std::to_string(steps), std::string("schedule.warmup_steps=2"),
                                 std::string("schedule.cosine_steps=12"), std::string("eval.interval=0"),
                                 std::string("logging.interval=1"), std::string("logging.progress=none"),
                                 std::string("logging.peak_flops=1e11"), std::string("checkpoint.interval=6"),
                                 std::string("checkpoint.keep_last=0"), std::string("sample.num_samples=0"),
                                 "data.train=" + (dir / "train.bin").string(), "data.val=" + (dir / "val.bin").string(),
                                 "data.tokenizer=" + (dir / "no_tokenizer.json").string()}) {
      cmd += " --set " + s;
    }
    return cmd + " " + extra;
  }
};

struct Ran {
  int status;
  std::string log;
};
Ran sh(const std::string& cmd, const fs::path& log) {
  const int st = std::system((cmd + " >" + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, std::string(std::istreambuf_iterator<char>(in), {})};
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "train") out.push_back(j.at("loss").get<double>());
  }
  return out;
}

void expect_same_run(const fs::path& ref, const fs::path& got) {
  const auto a = losses(ref), b = losses(got);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "loss at step " << i + 1;
  auto wa = io::SafetensorsFile::open((ref / "model.safetensors").string());
  auto wb = io::SafetensorsFile::open((got / "model.safetensors").string());
  ASSERT_EQ(wa.names(), wb.names());
  for (const std::string& name : wa.names()) {
    const auto x = wa.tensor(name).to_vector<float>(), y = wb.tensor(name).to_vector<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    float worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    EXPECT_LE(worst, 1e-5f) << name;
  }
}

// dsv3-tiny at a learning rate where its one noise-dominated embedding entry stays within 1e-5
// (expert_test.cpp says why).
const std::string kDeepSeekSets = "--set optimizer.lr=5e-4 --set optimizer.min_lr=5e-5";

class MpiCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dist::mpi_built()) GTEST_SKIP() << "loom built without MPI";
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not on PATH";
  }
};

}  // namespace

TEST_F(MpiCli, FourAndEightRanksEqualOneProcessAndResumeOnAnotherMesh) {
  Corpus c;
  const fs::path ref = c.dir / "ref", four = c.dir / "four", eight = c.dir / "eight", resumed = c.dir / "resumed";
  Ran r = sh(c.command(0, ref, 12), c.dir / "ref.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, four, 12, "--mesh data=2,tensor=2 --parallel fsdp_tp"), c.dir / "four.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("mesh data=2,tensor=2, mode fsdp_tp: 4 ranks over mpi"), std::string::npos) << r.log;
  expect_same_run(ref, four);
  r = sh(c.command(8, eight, 12, "--mesh data=4,tensor=2 --parallel fsdp_tp"), c.dir / "eight.log");
  ASSERT_EQ(r.status, 0) << r.log;
  expect_same_run(ref, eight);

  // Stop a 4-rank tp run at step 6 (its checkpoint), then resume it as 2 ranks of fsdp: the end equals
  // the uninterrupted single process (same schedule: cosine_steps is fixed at 12).
  r = sh(c.command(4, resumed, 6, "--mesh tensor=4 --parallel tp"), c.dir / "resumed1.log");
  ASSERT_EQ(r.status, 0) << r.log;
  // The checkpoint is sharded: an index and one file per rank (tp x4: every rank owns blocks), no whole
  // model file.
  const fs::path step6 = resumed / "checkpoints" / "step_00000006";
  EXPECT_TRUE(fs::exists(step6 / "shards.json"));
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(fs::exists(step6 / dist::shard_file_name(rank))) << rank;
  EXPECT_FALSE(fs::exists(step6 / "model.safetensors"));
  // The same checkpoint resumed by one process, without mpirun.
  const fs::path single = c.dir / "single";
  fs::copy(resumed, single, fs::copy_options::recursive);
  // A newer checkpoint that one rank did not finish (its file is missing) must be passed over.
  const fs::path step9 = resumed / "checkpoints" / "step_00000009";
  fs::copy(step6, step9, fs::copy_options::recursive);
  {
    std::ifstream in(step9 / "manifest.json");
    auto manifest = nlohmann::json::parse(in);
    manifest["step"] = 9;  // only the missing file is wrong with it
    std::ofstream(step9 / "manifest.json") << manifest.dump(2);
  }
  fs::remove(step9 / dist::shard_file_name(2));
  r = sh(c.command(2, resumed, 12, "--mesh data=2 --parallel fsdp --resume"), c.dir / "resumed2.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("skipping checkpoint " + step9.string()), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(dist::shard_file_name(2)), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, resumed);
  r = sh(c.command(0, single, 12, "--resume"), c.dir / "single.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, single);
}

// Overlapping communication with compute (the default) and --no-overlap give the same bits under MPI
// too: fsdp on 4 ranks (prefetched gathers, background reduce-scatters, bucketed all-reduces of the
// norms and tables) and dp on 2 with two micro-batches a step.
TEST_F(MpiCli, OverlapOnAndOffGiveTheSameBits) {
  Corpus c;
  auto file = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const std::string& how : {std::string("--mesh data=4 --parallel fsdp"),
                                 std::string("--mesh data=2 --parallel dp --set training.grad_accum_steps=2")}) {
    SCOPED_TRACE(how);
    const int ranks = how.find("data=4") != std::string::npos ? 4 : 2;
    const fs::path on = c.dir / "on", off = c.dir / "off";
    fs::remove_all(on);
    fs::remove_all(off);
    Ran r = sh(c.command(ranks, on, 6, how), c.dir / "on.log");
    ASSERT_EQ(r.status, 0) << r.log;
    r = sh(c.command(ranks, off, 6, how + " --no-overlap"), c.dir / "off.log");
    ASSERT_EQ(r.status, 0) << r.log;
    const auto a = losses(on), b = losses(off);
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(a, b);
    const std::string wa = file(on / "model.safetensors"), wb = file(off / "model.safetensors");
    EXPECT_FALSE(wa.empty());
    EXPECT_TRUE(wa == wb) << "the trained weights differ";
  }
}

// The pipe axis under mpirun: a 4-block tiny Llama, two micro-batches a step. pipe=2 x data=2 under 1F1B
// equals one process; a GPipe run on pipe=2 stopped at its step-6 checkpoint resumes on pipe=4 and ends
// where the uninterrupted single process does (a checkpoint does not depend on the pipe count).
TEST_F(MpiCli, PipeEqualsOneProcessAndResumesOnAnotherPipeCount) {
  Corpus c;
  const std::string model = "--set model.num_layers=4 --set training.grad_accum_steps=2 ";
  const fs::path ref = c.dir / "ref", four = c.dir / "four", resumed = c.dir / "resumed";
  Ran r = sh(c.command(0, ref, 12, model), c.dir / "ref.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, four, 12, model + "--mesh pipe=2,data=2 --parallel dp"), c.dir / "four.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("mesh data=2,tensor=1,pipe=2, mode dp: 4 ranks over mpi"), std::string::npos) << r.log;
  expect_same_run(ref, four);
  // The bubble is reported beside the ideal (P - 1) / (M + P - 1) = 1/3.
  std::ifstream in(four / "metrics.jsonl");
  bool seen = false;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") != "train") continue;
    seen = true;
    EXPECT_NEAR(j.at("pipe_bubble_ideal").get<double>(), 1.0 / 3.0, 1e-12);
    const double bubble = j.at("pipe_bubble").get<double>();
    EXPECT_TRUE(bubble >= 0 && bubble < 1) << bubble;
  }
  EXPECT_TRUE(seen);

  // Interleaved 1F1B, two stages per rank (4 virtual stages of one block): the same run, and its ideal
  // bubble (P - 1) / (v M + P - 1) = 1/5.
  const fs::path inter = c.dir / "inter";
  r = sh(c.command(2, inter, 12, model + "--mesh pipe=2 --parallel dp --set parallel.schedule=interleaved --set parallel.virtual_stages=2"),
         c.dir / "inter.log");
  ASSERT_EQ(r.status, 0) << r.log;
  expect_same_run(ref, inter);
  std::ifstream inter_metrics(inter / "metrics.jsonl");
  for (std::string line; std::getline(inter_metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "train") {
      EXPECT_NEAR(j.at("pipe_bubble_ideal").get<double>(), 0.2, 1e-12);
    }
  }

  r = sh(c.command(2, resumed, 6, model + "--mesh pipe=2 --parallel dp --set parallel.schedule=gpipe"),
         c.dir / "resumed1.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, resumed, 12, model + "--mesh pipe=4 --parallel dp --resume"), c.dir / "resumed2.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, resumed);
}

// dsv3-tiny through a pipe under mpirun: 4 blocks (1 dense, 3 MoE), two micro-batches a step, pipe=2 x
// expert=2 under dp_ep (the stages' MoE blocks split their experts, the loads summed over the stages for
// the bias updates); stopped at step 6 and resumed as one process: all 12 losses and the weights (the
// routing biases included) equal the uninterrupted single process's.
TEST_F(MpiCli, DeepSeekThroughAPipeEqualsOneProcessAndResumesWithoutIt) {
  Corpus c;
  const std::string sets = kDeepSeekSets + " --set model.num_layers=4 --set training.grad_accum_steps=2 ";
  const fs::path ref = c.dir / "ref", piped = c.dir / "piped";
  Ran r = sh(c.command(0, ref, 12, sets, "dsv3-tiny"), c.dir / "ref.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, piped, 6, sets + "--mesh pipe=2,expert=2 --parallel dp_ep", "dsv3-tiny"), c.dir / "p1.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(0, piped, 12, sets + "--resume", "dsv3-tiny"), c.dir / "p2.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, piped);
}

// The pipe axis on 8 ranks under mpirun, each mode inside the stages: tiny Llama (4 blocks) on pipe=2 x
// data=2 x tensor=2 (fsdp_tp, 1F1B) and pipe=2 x data=4 (fsdp, GPipe); GPT-2 with its tied head on
// pipe=4 x data=2 (dp, 1F1B: the table's gradient summed over the first and last of four stages); dsv3-tiny
// (4 blocks: 1 dense, 3 MoE) on pipe=2 x data=2 x expert=2 (fsdp_ep, GPipe). Two micro-batches a step,
// 20 steps, as the in-process tests (tests/parallel/pipeline_test) run every combination; every loss and
// the final weights (the routing biases included) equal one process's.
TEST_F(MpiCli, PipeOnEightRanksEqualsOneProcessInEveryMode) {
  Corpus c;
  constexpr int64_t kPipeMpiSteps = 20;
  const std::string accum = "--set model.num_layers=4 --set training.grad_accum_steps=2 ";
  const std::string gpt2 = accum + "--set model.d_model=64 --set model.num_heads=4 --set model.dropout=0 "
                                   "--set training.precision=f32 --set optimizer.lr=3e-3 ";
  struct Run {
    std::string preset, sets, mesh;
  };
  const std::vector<Run> runs = {
      {"tiny", accum, "--mesh pipe=2,data=2,tensor=2 --parallel fsdp_tp --set parallel.schedule=1f1b"},
      {"tiny", accum, "--mesh pipe=2,data=4 --parallel fsdp --set parallel.schedule=gpipe"},
      {"gpt2-small", gpt2, "--mesh pipe=4,data=2 --parallel dp --set parallel.schedule=1f1b"},
      {"dsv3-tiny", accum + kDeepSeekSets + " ", "--mesh pipe=2,data=2,expert=2 --parallel fsdp_ep --set parallel.schedule=gpipe"},
  };
  std::map<std::string, fs::path> refs;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& k = runs[i];
    SCOPED_TRACE(k.preset + " " + k.mesh);
    if (!refs.count(k.preset)) {
      const fs::path ref = c.dir / ("ref_" + k.preset);
      Ran r = sh(c.command(0, ref, kPipeMpiSteps, k.sets, k.preset), c.dir / "ref.log");
      ASSERT_EQ(r.status, 0) << r.log;
      refs[k.preset] = ref;
    }
    const fs::path got = c.dir / ("run_" + std::to_string(i));
    Ran r = sh(c.command(8, got, kPipeMpiSteps, k.sets + k.mesh, k.preset), c.dir / "run.log");
    ASSERT_EQ(r.status, 0) << r.log;
    EXPECT_NE(r.log.find("8 ranks over mpi"), std::string::npos) << r.log;
    expect_same_run(refs[k.preset], got);
  }
}

TEST_F(MpiCli, AMeshThatDoesNotMatchTheRanksIsRefused) {
  Corpus c;
  Ran r = sh(c.command(2, c.dir / "x", 2, "--mesh data=4 --parallel dp"), c.dir / "x.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.log.find("mesh data=4,tensor=1 needs 4 ranks, but the launcher started only 2"), std::string::npos) << r.log;
  r = sh(c.command(0, c.dir / "y", 2, "--mesh data=2,tensor=2 --parallel fsdp_tp"), c.dir / "y.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.log.find("needs 4 ranks"), std::string::npos) << r.log;
}

namespace {
// Kills one of 4 ranks of `mesh_args` (past step 6) with kill -9: the job must end in bounded time, and
// the same command with --resume continue from the newest complete checkpoint.
void kill_one_rank_and_resume(const std::string& mesh_args, const std::string& preset) {
  Corpus c;
  const fs::path out = c.dir / "killed", log = c.dir / "killed.log";
  const std::string cmd = c.command(4, out, 100000, mesh_args, preset) + " >" + log.string() + " 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for training to be under way (a few metrics lines), then kill -9 one rank (a child of mpirun).
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::ifstream in(out / "metrics.jsonl");
    int lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    if (lines >= 8) break;  // past step 6: its checkpoint is complete
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string victim = "pgrep -P " + std::to_string(pid) + " -f 'loom train' | tail -1";
  FILE* p = popen(victim.c_str(), "r");
  char buf[64] = {0};
  ASSERT_NE(fgets(buf, sizeof buf, p), nullptr) << "no rank found under mpirun";
  pclose(p);
  const pid_t rank_pid = static_cast<pid_t>(std::atoi(buf));
  ASSERT_GT(rank_pid, 0);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(rank_pid, SIGKILL), 0);
  int st = 0;
  bool ended = false;
  while (std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(60)) {
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!ended) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &st, 0);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_TRUE(ended) << "the job was still running 60 s after a rank was killed";
  EXPECT_LT(seconds, 30.0);
  EXPECT_NE(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
  std::ifstream in(log);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  EXPECT_TRUE(text.find("signal 9") != std::string::npos || text.find("got no answer") != std::string::npos) << text;
  std::printf("job ended %.2f s after kill -9 of rank pid %d\n", seconds, rank_pid);

  // The same command with --resume continues from the newest complete checkpoint.
  int64_t newest = 0;
  for (const auto& e : fs::directory_iterator(out / "checkpoints")) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0) newest = std::max<int64_t>(newest, std::stoll(n.substr(5)));
  }
  ASSERT_GE(newest, 6);
  Ran r = sh(c.command(4, out, newest + 2, mesh_args + " --resume", preset), c.dir / "resume.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step " + std::to_string(newest)), std::string::npos) << r.log;
  // And the run exports like any other (rank 0 wrote the gathered weights).
  r = sh(std::string(LOOM_CLI) + " export --run " + out.string() + " --out " + (c.dir / "hf").string(), c.dir / "export.log");
  EXPECT_EQ(r.status, 0) << r.log;
  EXPECT_TRUE(fs::exists(c.dir / "hf" / "model.safetensors"));
}
}  // namespace

TEST_F(MpiCli, KillingOneRankEndsTheJobInBoundedTime) { kill_one_rank_and_resume("--mesh data=2,tensor=2 --parallel fsdp_tp", "tiny"); }

TEST_F(MpiCli, KillingOneRankOfAPipelineEndsTheJob) {
  kill_one_rank_and_resume("--mesh pipe=2,data=2 --parallel dp --set model.num_layers=4 --set training.grad_accum_steps=2",
                           "tiny");
}

// The same under expert parallelism (every MoE layer's all-to-all waits on the killed rank).
TEST_F(MpiCli, KillingOneRankUnderExpertParallelismEndsTheJob) {
  kill_one_rank_and_resume("--mesh data=2,expert=2 --parallel dp_ep " + kDeepSeekSets, "dsv3-tiny");
}

// dsv3-tiny on 4 ranks of expert parallelism equals one process (losses, weights and routing biases in
// model.safetensors), and a checkpoint written with expert=4 resumes with expert=2 to the same end.
TEST_F(MpiCli, DeepSeekExpertParallelEqualsOneProcessAndResumesOnAnotherExpertCount) {
  Corpus c;
  const fs::path ref = c.dir / "ref", ep = c.dir / "ep", resumed = c.dir / "resumed";
  Ran r = sh(c.command(0, ref, 12, kDeepSeekSets, "dsv3-tiny"), c.dir / "ref.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, ep, 12, "--mesh data=2,expert=2 --parallel dp_ep " + kDeepSeekSets, "dsv3-tiny"), c.dir / "ep.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("mesh data=2,tensor=1,expert=2, mode dp_ep: 4 ranks over mpi"), std::string::npos) << r.log;
  expect_same_run(ref, ep);

  r = sh(c.command(4, resumed, 6, "--mesh expert=4 --parallel dp_ep " + kDeepSeekSets, "dsv3-tiny"), c.dir / "r1.log");
  ASSERT_EQ(r.status, 0) << r.log;
  // Expert shards per rank: with expert=4 each rank owns one expert of every expert tensor.
  const fs::path step6 = resumed / "checkpoints" / "step_00000006";
  for (int rank = 0; rank < 4; ++rank) {
    auto f = io::SafetensorsFile::open((step6 / dist::shard_file_name(rank)).string());
    EXPECT_TRUE(f.contains("layers.1.moe.experts.w1")) << rank;
    EXPECT_EQ(f.info("layers.1.moe.experts.w1").shape, (std::vector<uint64_t>{1, 16, 32})) << rank;
    EXPECT_EQ(f.contains("layers.1.moe.bias"), rank == 0) << "model state: rank 0 writes it, once";
  }
  r = sh(c.command(2, resumed, 12, "--mesh expert=2 --parallel fsdp_ep --resume " + kDeepSeekSets, "dsv3-tiny"),
         c.dir / "r2.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, resumed);
}

// fsdp_ep on data=2 x expert=2 under mpirun: the dense weights split over all four ranks (the expert axis
// folded into data), the experts over expert and data. Steps 1-6 run so and checkpoint a quarter of every
// dense weight per rank; steps 7-12 resume on another data x expert shape (1 x 2); all 12 losses and the
// final weights equal one process's.
TEST_F(MpiCli, DeepSeekFsdpEpOnDataTimesExpertEqualsOneProcessAndResumesOnAnotherShape) {
  Corpus c;
  const fs::path ref = c.dir / "ref", resumed = c.dir / "resumed";
  Ran r = sh(c.command(0, ref, 12, kDeepSeekSets, "dsv3-tiny"), c.dir / "ref.log");
  ASSERT_EQ(r.status, 0) << r.log;
  r = sh(c.command(4, resumed, 6, "--mesh data=2,expert=2 --parallel fsdp_ep " + kDeepSeekSets, "dsv3-tiny"),
         c.dir / "r1.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("mesh data=2,tensor=1,expert=2, mode fsdp_ep: 4 ranks over mpi"), std::string::npos) << r.log;
  const fs::path step6 = resumed / "checkpoints" / "step_00000006";
  const auto index = nlohmann::json::parse(std::ifstream(step6 / dist::kShardIndex));
  for (const auto& t : index.at("tensors")) {
    if (t.at("name") == "layers.0.attn.wq_b.weight") {
      EXPECT_EQ(t.at("spec"), "(None, (data, expert))");
    }
  }
  for (int rank = 0; rank < 4; ++rank) {
    auto f = io::SafetensorsFile::open((step6 / dist::shard_file_name(rank)).string());
    // wq_b [H (N + P), Q] = [24, 16]: a quarter of Q per rank, and so for its moments.
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"}) {
      EXPECT_EQ(f.info(std::string("layers.0.attn.wq_b.weight") + suffix).shape, (std::vector<uint64_t>{24, 4})) << rank;
    }
    // The experts [E, F, C] = [4, 16, 32]: half of them, half of d_model.
    EXPECT_EQ(f.info("layers.1.moe.experts.w1").shape, (std::vector<uint64_t>{2, 16, 16})) << rank;
  }
  r = sh(c.command(2, resumed, 12, "--mesh expert=2 --parallel fsdp_ep --resume " + kDeepSeekSets, "dsv3-tiny"),
         c.dir / "r2.log");
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_NE(r.log.find("resuming from step 6"), std::string::npos) << r.log;
  expect_same_run(ref, resumed);
}
