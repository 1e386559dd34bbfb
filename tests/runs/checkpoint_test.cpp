// Checkpoints: exact resume (2N steps == N steps + resume + N steps, bitwise), the Ctrl-C path,
// validation of damaged or unfinished checkpoints, retention, and a kill -9 crash test of `loom train`.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/safetensors.h"
#include "support/op_test.h"
#include "support/synthetic_corpus.h"
#include "runs/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::SyntheticCorpusDir {
  TempDir() : SyntheticCorpusDir("loom_checkpoint_test") {}

  std::vector<std::string> overrides(int64_t steps, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> o = {
        "model.vocab_size=64", "training.max_steps=" + std::to_string(steps), "training.batch_size=4",
        "model.context_length=32", "schedule.warmup_steps=5", "schedule.cosine_steps=40", "eval.interval=10",
        "eval.batches=2", "logging.interval=1", "logging.progress=none", "logging.peak_flops=1e11",
        "training.threads=1", "checkpoint.interval=10", "checkpoint.keep_last=2", "sample.num_samples=0",
        "data.train=\"" + (dir / "train.bin").string() + "\"", "data.val=\"" + (dir / "val.bin").string() + "\"",
        "data.tokenizer=\"" + (dir / "no_tokenizer.json").string() + "\""};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  }
  train::TrainConfig config(int64_t steps, const std::vector<std::string>& extra = {},
                            const std::string& preset = "tiny") const {
    return train::TrainConfig::load(preset, overrides(steps, extra));
  }
};

// (event, step) -> value, for every train and val event, in file order.
struct Curve {
  std::vector<std::pair<int64_t, double>> train, val;
};
Curve curve_of(const fs::path& run) {
  Curve c;
  for (const auto& e : train::read_metrics((run / "metrics.jsonl").string())) {
    const std::string kind = e.value("event", "");
    if (kind == "train") c.train.emplace_back(e.at("step").get<int64_t>(), e.at("loss").get<double>());
    if (kind == "val") c.val.emplace_back(e.at("step").get<int64_t>(), e.at("val_loss").get<double>());
  }
  return c;
}

void expect_same_curve(const Curve& a, const Curve& b) {
  ASSERT_EQ(a.train.size(), b.train.size());
  for (size_t i = 0; i < a.train.size(); ++i) {
    EXPECT_EQ(a.train[i].first, b.train[i].first) << "train event " << i;
    EXPECT_EQ(a.train[i].second, b.train[i].second) << "train loss at step " << a.train[i].first;  // bitwise
  }
  ASSERT_EQ(a.val.size(), b.val.size());
  for (size_t i = 0; i < a.val.size(); ++i) {
    EXPECT_EQ(a.val[i].first, b.val[i].first) << "val event " << i;
    EXPECT_EQ(a.val[i].second, b.val[i].second) << "val loss at step " << a.val[i].first;
  }
}

void expect_same_tensors(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << name << " differs";
  }
}

std::map<std::string, Tensor> params_of(train::Trainer& t) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : t.model().parameters()) out[p->name] = p->value.clone();
  return out;
}

std::map<std::string, Tensor> moments_of(train::Trainer& t) {
  std::map<std::string, Tensor> out;
  auto& opt = t.optimizer();
  for (size_t i = 0; i < opt.params().size(); ++i) {
    out[opt.params()[i]->name + ".m"] = opt.exp_avg(i).clone();
    out[opt.params()[i]->name + ".v"] = opt.exp_avg_sq(i).clone();
  }
  return out;
}

}  // namespace

TEST(Checkpoint, ResumeGivesBitwiseTheUninterruptedRun) {
  TempDir tmp;
  for (std::vector<std::string> extra : {std::vector<std::string>{},
                                         std::vector<std::string>{"training.grad_accum_steps=2",
                                                                  "training.sampling=\"sequential\""}}) {
    SCOPED_TRACE(extra.empty() ? "random sampling" : "sequential sampling, accumulation");
    const fs::path a = tmp.dir / "a", b = tmp.dir / "b";
    fs::remove_all(a);
    fs::remove_all(b);
    train::Trainer whole(tmp.config(40, extra), a.string());
    whole.run();

    {
      train::Trainer first(tmp.config(20, extra), b.string());
      first.run();
    }
    ASSERT_TRUE(fs::exists(b / "checkpoints" / "step_00000020" / "manifest.json"));
    train::Trainer second(tmp.config(40, extra), b.string());
    ASSERT_EQ(second.resume(), std::optional<int64_t>(20));
    second.run();

    expect_same_curve(curve_of(a), curve_of(b));
    expect_same_tensors(params_of(whole), params_of(second));
    expect_same_tensors(moments_of(whole), moments_of(second));
    EXPECT_EQ(whole.optimizer().step_count(), second.optimizer().step_count());
    // The final checkpoints are the same bytes too.
    expect_same_tensors(io::load_safetensors((a / "checkpoints/step_00000040/model.safetensors").string()),
                        io::load_safetensors((b / "checkpoints/step_00000040/model.safetensors").string()));
  }
}

// GPT-2 with dropout on (embeddings, attention probabilities, residual branches) and accumulation: the
// masks are keyed by (seed, step, micro-batch, layer, site), so a resumed run draws the same ones.
TEST(Checkpoint, Gpt2WithDropoutResumesBitwise) {
  TempDir tmp;
  const std::vector<std::string> gpt2 = {"model.d_model=32", "model.num_heads=2", "model.num_layers=2",
                                         "model.dropout=0.2", "training.grad_accum_steps=2"};
  const fs::path a = tmp.dir / "a", b = tmp.dir / "b", c = tmp.dir / "c";
  train::Trainer whole(tmp.config(30, gpt2, "gpt2-austen"), a.string());
  whole.run();
  {
    train::Trainer first(tmp.config(20, gpt2, "gpt2-austen"), b.string());
    first.run();
  }
  train::Trainer second(tmp.config(30, gpt2, "gpt2-austen"), b.string());
  ASSERT_EQ(second.resume(), std::optional<int64_t>(20));
  second.run();
  expect_same_curve(curve_of(a), curve_of(b));
  expect_same_tensors(params_of(whole), params_of(second));
  // Dropout is really on: without it the same run takes another path.
  std::vector<std::string> no_dropout = gpt2;
  no_dropout.push_back("model.dropout=0");
  train::Trainer plain(tmp.config(30, no_dropout, "gpt2-austen"), c.string());
  plain.run();
  EXPECT_NE(curve_of(a).train.back().second, curve_of(c).train.back().second);
}

TEST(Checkpoint, StopSavesACheckpointThatResumesExactly) {
  TempDir tmp;
  const fs::path a = tmp.dir / "a", b = tmp.dir / "b";
  train::Trainer whole(tmp.config(30), a.string());
  whole.run();
  {
    train::Trainer stopped(tmp.config(30), b.string());
    train::StopSignal stop;
    stopped.after_backward = [&](int64_t step, std::vector<Tensor>&) {
      if (step == 12) stop.request();  // Ctrl-C during step 13: it finishes, saves, returns
    };
    auto summary = stopped.run(&stop);
    EXPECT_TRUE(summary.stopped_early);
    EXPECT_EQ(summary.steps_completed, 13);
  }
  auto refs = runs::list_checkpoints(b.string());
  ASSERT_FALSE(refs.empty());
  EXPECT_EQ(refs.back().step, 13);
  train::Trainer resumed(tmp.config(30), b.string());
  ASSERT_EQ(resumed.resume(), std::optional<int64_t>(13));
  auto summary = resumed.run();
  EXPECT_EQ(summary.steps_completed, 30);
  expect_same_curve(curve_of(a), curve_of(b));
  expect_same_tensors(params_of(whole), params_of(resumed));
}

TEST(Checkpoint, LayoutAndTrainerState) {
  TempDir tmp;
  const fs::path run = tmp.dir / "run";
  train::Trainer t(tmp.config(20), run.string());
  t.run();
  const fs::path c = run / "checkpoints" / "step_00000020";
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "manifest.json"}) {
    EXPECT_TRUE(fs::exists(c / f)) << f;
  }
  auto opt = io::SafetensorsFile::open((c / "optimizer.safetensors").string());
  EXPECT_EQ(opt.info("step").dtype, io::SafetensorsDtype::I64);
  EXPECT_TRUE(opt.contains("lm_head.weight.exp_avg") && opt.contains("lm_head.weight.exp_avg_sq"));
  EXPECT_EQ(opt.size(), 1 + 2 * t.model().parameters().size());
  auto model = io::SafetensorsFile::open((c / "model.safetensors").string());
  EXPECT_TRUE(model.contains("layers.0.attn.q_proj.weight"));
  std::ifstream in(c / "trainer_state.json");
  nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["step"], 20);
  EXPECT_EQ(s["data_loader"]["batches"], 20);
  EXPECT_EQ(s["config"]["training"]["seed"], t.config().training.seed);
  EXPECT_EQ(s["last_train"]["step"], 20);
  EXPECT_TRUE(s["val_loss"].is_number());
  EXPECT_EQ(s["rng"]["root_key"].size(), 2u);
}

TEST(Checkpoint, DamagedOrUnfinishedCheckpointsAreSkipped) {
  TempDir tmp;
  const fs::path run = tmp.dir / "run";
  train::Trainer t(tmp.config(30, {"checkpoint.keep_last=0"}), run.string());
  t.run();
  const fs::path ck = run / "checkpoints";
  ASSERT_EQ(runs::list_checkpoints(run.string()).size(), 3u);  // 10, 20, 30
  EXPECT_FALSE(runs::checkpoint_problem((ck / "step_00000030").string()));

  // A flipped byte in the newest one's weights, and a newer one whose manifest was never written.
  {
    std::fstream f(ck / "step_00000030" / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  fs::copy(ck / "step_00000020", ck / "step_00000040", fs::copy_options::recursive);
  fs::remove(ck / "step_00000040" / "manifest.json");
  // A stray temporary directory (a writer killed mid-checkpoint) with a higher step is ignored.
  fs::copy(ck / "step_00000020", ck / ".tmp-step_00000050-1", fs::copy_options::recursive);

  auto p30 = runs::checkpoint_problem((ck / "step_00000030").string());
  ASSERT_TRUE(p30);
  EXPECT_NE(p30->find("model.safetensors"), std::string::npos) << *p30;
  auto p40 = runs::checkpoint_problem((ck / "step_00000040").string());
  ASSERT_TRUE(p40);
  EXPECT_NE(p40->find("manifest"), std::string::npos) << *p40;

  // A checkpoint copied under another step's name is caught by the manifest's step.
  fs::copy(ck / "step_00000010", ck / "step_00000035", fs::copy_options::recursive);
  auto p35 = runs::checkpoint_problem((ck / "step_00000035").string());
  ASSERT_TRUE(p35);
  EXPECT_NE(p35->find("says step 10"), std::string::npos) << *p35;
  // A truncated file is caught by its size (step 10 is older than the one resume picks, so not visited).
  fs::resize_file(ck / "step_00000010" / "optimizer.safetensors", 100);
  auto p10 = runs::checkpoint_problem((ck / "step_00000010").string());
  ASSERT_TRUE(p10);
  EXPECT_NE(p10->find("bytes"), std::string::npos) << *p10;

  std::vector<std::string> skipped;
  train::Trainer r(tmp.config(30), run.string());
  auto step = r.resume([&](const std::string& path, const std::string&) { skipped.push_back(fs::path(path).filename()); });
  EXPECT_EQ(step, std::optional<int64_t>(20));
  EXPECT_EQ(skipped, (std::vector<std::string>{"step_00000040", "step_00000035", "step_00000030"}));
}

TEST(Checkpoint, ADifferentRunIsRefused) {
  TempDir tmp;
  const fs::path run = tmp.dir / "run";
  train::Trainer(tmp.config(10), run.string()).run();
  // A fresh start into a directory with checkpoints would leave the old ones to be resumed later.
  try {
    train::Trainer(tmp.config(10), run.string()).run();
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
  train::Trainer other(tmp.config(10, {"training.seed=7"}), run.string());
  EXPECT_THROW(other.resume(), Error);
  train::Trainer bigger(tmp.config(10, {"model.d_model=64", "model.d_ff=128"}), run.string());
  EXPECT_THROW(bigger.resume(), Error);
}

TEST(Checkpoint, RetentionKeepsTheLastKAndTheBest) {
  TempDir tmp;
  const fs::path run = tmp.dir / "run";
  train::Trainer t(tmp.config(50, {"eval.interval=10", "checkpoint.keep_last=2"}), run.string());
  t.run();
  std::vector<int64_t> steps;
  for (const auto& c : runs::list_checkpoints(run.string())) steps.push_back(c.step);
  // Loss falls monotonically here, so the best is also the newest: exactly the last two remain.
  EXPECT_EQ(steps, (std::vector<int64_t>{40, 50}));

  // The best by validation loss survives: after step 10 the gradients are negated, so validation gets
  // worse, and with keep_last=1 only the newest and the best (step 10) remain.
  const fs::path noisy = tmp.dir / "noisy";
  train::Trainer n(tmp.config(40, {"checkpoint.keep_last=1"}), noisy.string());
  n.after_backward = [](int64_t step, std::vector<Tensor>& grads) {
    if (step < 10) return;
    for (Tensor& g : grads) {  // gradient ascent from here on
      for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = -g.data<float>()[i];
    }
  };
  n.run();
  int64_t best_step = -1;
  double best = 1e30;
  for (const auto& [s, v] : curve_of(noisy).val) {
    if (s > 0 && v < best) best = v, best_step = s;
  }
  ASSERT_NE(best_step, 40) << "gradient ascent should make a checkpoint other than the last the best";
  steps.clear();
  for (const auto& c : runs::list_checkpoints(noisy.string())) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{best_step, 40}));

  // Directly: keep the last 2 plus step 10.
  const fs::path ck = run / "checkpoints";
  for (int s : {10, 20, 30}) fs::copy(ck / "step_00000040", ck / runs::checkpoint_name(s), fs::copy_options::recursive);
  fs::create_directories(ck / ".trash-step_00000005-1");
  auto deleted = runs::apply_retention(run.string(), 2, {10});
  EXPECT_EQ(deleted, (std::vector<int64_t>{20, 30}));
  steps.clear();
  for (const auto& c : runs::list_checkpoints(run.string())) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 40, 50}));
  EXPECT_FALSE(fs::exists(ck / ".trash-step_00000005-1"));
}

// The real CLI, first stopped with Ctrl-C (SIGINT), then killed with SIGKILL at random moments (many of them inside checkpoint writes, which the
// LOOM_TEST_CHECKPOINT_PAUSE_MS hook stretches), then resumed, until it finishes. After every kill, each
// step_<N> directory must be complete, and the newest must be at most one interval behind the last step
// the run logged. The final metrics and weights must equal an uninterrupted run's, bitwise.
TEST(Checkpoint, KillNineAndResumeMatchesAnUninterruptedRun) {
  TempDir tmp;
  const int64_t steps = 200, interval = 10;
  const fs::path ref = tmp.dir / "ref", crash = tmp.dir / "crash";
  auto args_for = [&](const fs::path& out, bool resume) {
    std::vector<std::string> a = {LOOM_CLI, "train", "--config", "tiny", "--out", out.string()};
    for (const auto& o : tmp.overrides(steps, {"checkpoint.keep_last=2"})) {
      a.push_back("--set");
      a.push_back(o);
    }
    if (resume) a.push_back("--resume");
    return a;
  };
  auto spawn = [&](const std::vector<std::string>& args, const fs::path& log, const char* pause_ms) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::FILE* f = std::freopen(log.c_str(), "a", stderr);
      (void)f;
      std::freopen("/dev/null", "w", stdout);
      if (pause_ms) ::setenv("LOOM_TEST_CHECKPOINT_PAUSE_MS", pause_ms, 1);
      std::vector<char*> argv;
      for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  };
  auto wait_exit = [](pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  };

  int status = wait_exit(spawn(args_for(ref, false), tmp.dir / "ref.log", nullptr));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reference run failed, see " << tmp.dir / "ref.log";

  auto last_logged_step = [&](const fs::path& run) -> int64_t {
    int64_t logged = 0;
    if (!fs::exists(run / "metrics.jsonl")) return 0;
    for (const auto& e : train::read_metrics((run / "metrics.jsonl").string())) {
      if (e.value("event", "") == "train") logged = std::max(logged, e.at("step").get<int64_t>());
    }
    return logged;
  };

  // Ctrl-C first: the run stops at its last completed step, saves a checkpoint of exactly that step, and
  // exits with 130 (interrupted by SIGINT).
  {
    pid_t pid = spawn(args_for(crash, true), tmp.dir / "crash.log", nullptr);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (last_logged_step(crash) < 15 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid, SIGINT);
    status = wait_exit(pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "Ctrl-C'd run failed, see " << tmp.dir / "crash.log";
    auto refs = runs::list_checkpoints(crash.string());
    ASSERT_FALSE(refs.empty());
    EXPECT_EQ(refs.back().step, last_logged_step(crash)) << "Ctrl-C must save the step it stopped at";
    EXPECT_LT(refs.back().step, steps);
  }

  RngKey key = RngKey::from_seed(2024);
  int kills = 0, mid_checkpoint = 0;
  bool finished = false;
  for (int round = 0; round < 40 && !finished && kills < 14; ++round) {
    pid_t pid = spawn(args_for(crash, true), tmp.dir / "crash.log", round % 2 ? "2" : "30");
    const int delay_ms = 20 + static_cast<int>(random_bits(key, static_cast<uint64_t>(round)) % 250);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
    int st = 0;
    pid_t done = 0;
    while (std::chrono::steady_clock::now() < deadline && (done = ::waitpid(pid, &st, WNOHANG)) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (done == pid) {
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "run failed, see " << tmp.dir / "crash.log";
      finished = true;
      break;
    }
    ::kill(pid, SIGKILL);
    wait_exit(pid);
    ++kills;
    bool tmp_left = false;
    if (fs::exists(crash / "checkpoints")) {
      for (const auto& e : fs::directory_iterator(crash / "checkpoints")) {
        const std::string name = e.path().filename().string();  // .tmp-step_<N>-<pid of the writer>
        if (name.rfind(".tmp-", 0) == 0 && name.ends_with("-" + std::to_string(pid))) tmp_left = true;
      }
    }
    mid_checkpoint += tmp_left;
    // Every visible checkpoint is complete.
    for (const auto& c : runs::list_checkpoints(crash.string())) {
      auto problem = runs::checkpoint_problem(c.path);
      EXPECT_FALSE(problem) << "after kill " << kills << ": " << c.path << ": " << *problem;
    }
    // At most one interval lost: the newest checkpoint is within `interval` of the last logged step.
    {
      const int64_t logged = last_logged_step(crash);
      auto refs = runs::list_checkpoints(crash.string());
      const int64_t newest = refs.empty() ? 0 : refs.back().step;
      EXPECT_LE(logged - newest, interval) << "after kill " << kills << ": logged step " << logged
                                           << ", newest checkpoint " << newest;
    }
  }
  if (!finished) {
    status = wait_exit(spawn(args_for(crash, true), tmp.dir / "crash.log", nullptr));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "final resume failed, see " << tmp.dir / "crash.log";
  }
  EXPECT_GE(kills, 5);
  EXPECT_GE(mid_checkpoint, 1) << "no kill landed inside a checkpoint write";
  std::printf("[ crash    ] %d kills, %d inside a checkpoint write\n", kills, mid_checkpoint);

  Curve a = curve_of(ref), b = curve_of(crash);
  ASSERT_EQ(a.train.size(), static_cast<size_t>(steps));
  expect_same_curve(a, b);
  expect_same_tensors(io::load_safetensors((ref / "model.safetensors").string()),
                      io::load_safetensors((crash / "model.safetensors").string()));
}
