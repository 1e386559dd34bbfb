// `loom train`: with no arguments, the default job end to end (tokenizer, data, training, samples). What a
// run does is train::run_training (src/train/run.h); this file reads the options, prints what it reports
// and turns how the run ended into the exit status (cli/exit_codes.h).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "cli/exit_codes.h"
#include "mesh/mpi.h"
#include "train/run.h"

namespace {
namespace fs = std::filesystem;

struct TrainArgs {
  std::string config = "default";
  std::string out;
  std::vector<std::string> sets;
  bool resume = false;
  bool overwrite = false;
  std::string max_memory;
  std::string mesh, parallel;
  std::string device;  // empty: the config's training.device
  bool no_overlap = false;
  std::string weights;
};

TrainArgs args;  // filled by CLI11 when `train` parses

// The summary line of a run that ended, on stderr.
void print_end(const loom::train::TrainOutcome& o) {
  const auto& s = o.summary;
  if (s.stopped_early) {
    std::fprintf(stderr, "interrupted at step %lld of %lld (%lld skipped), %.0f tokens/s\nweights: %s/model.safetensors\n"
                 "continue with: loom train --out %s --resume\n",
                 static_cast<long long>(s.steps_completed), static_cast<long long>(o.max_steps),
                 static_cast<long long>(s.steps_skipped), s.tokens_per_s, o.run_dir.c_str(), o.run_dir.c_str());
    return;
  }
  std::fprintf(stderr, "done: %lld steps (%lld skipped), %.0f tokens/s", static_cast<long long>(s.steps_completed),
               static_cast<long long>(s.steps_skipped), s.tokens_per_s);
  if (s.first_val_loss && s.last_val_loss) {
    std::fprintf(stderr, ", validation loss %.4f -> %.4f", *s.first_val_loss, *s.last_val_loss);
  }
  std::fprintf(stderr, "\nweights: %s/model.safetensors\n", o.run_dir.c_str());
}

loom::cli::Register reg("train", "Train a model (default: the small Llama-style model on Jane Austen)", [](CLI::App& cmd) {
  auto* config_opt = loom::cli::in_file(cmd.add_option("--config", args.config,
                 "preset (tiny, default, cs336-tinystories, gpt2-austen, gpt2-small, ...) or a JSON file (its missing "
                 "keys come from the preset its \"base\" key names, else the built-in defaults, as a preset's do; "
                 "relative paths resolve against the working directory; `loom config` prints it resolved)"),
                                       "config")
                         ->type_name("PRESET|FILE");
  loom::cli::out_dir(cmd.add_option("--out", args.out, "run directory (default: runs/<preset or file name>)"), "train");
  cmd.add_option("--set", args.sets, "override a config key: --set optimizer.lr=3e-4 (repeatable)");
  cmd.add_option("--mesh", args.mesh,
                 "device mesh, e.g. data=4,tensor=2 or data=2,expert=2 (config key parallel.mesh); its size must equal the number of "
                 "ranks mpirun/srun started (docs/mesh.md)");
  cmd.add_option("--parallel", args.parallel, "parallel mode: dp, fsdp, tp, fsdp_tp, dp_ep or fsdp_ep (config key parallel.mode)");
  cmd.add_option("--device", args.device,
                 "cpu (default), cuda or cuda:N: where the step runs, one process on a GPU (config key training.device; "
                 "docs/cuda.md)");
  cmd.add_flag("--no-overlap", args.no_overlap,
               "on a mesh: wait on every collective where it is issued instead of overlapping communication with "
               "compute (docs/mesh.md; the results are the same bits either way)");
  cmd.add_option("--max-memory", args.max_memory,
                 "memory the run may use, e.g. 8G (default: MemAvailable); a config estimated above it is refused");
  auto* resume_opt = cmd.add_flag("--resume", args.resume,
                                  "continue from the newest valid checkpoint in --out (its config.json is the config "
                                  "unless --config is given; --set still applies)");
  loom::cli::in_path(cmd.add_option("--weights", args.weights,
                 "start from these weights, with their tokenizer: a GGUF file, a Hugging Face directory or a loom weights "
                 "file (the model section is theirs; token files go to data/<weights name>/)"),
                     "weights")
      ->excludes(resume_opt);
  cmd.add_flag("--overwrite", args.overwrite,
               "replace the loom run in --out: its files and checkpoints are deleted (files loom did not write stay)")
      ->excludes(resume_opt);
  cmd.callback([config_opt] {
    loom::train::TrainRunOptions run;
    run.out = args.out.empty() ? loom::train::default_run_dir(args.config) : args.out;
    const fs::path saved_config = fs::path(run.out) / "config.json";
    const bool use_saved = args.resume && config_opt->count() == 0 && fs::exists(saved_config);
    run.sets = args.sets;
    if (!args.mesh.empty()) run.sets.push_back("parallel.mesh=" + args.mesh);
    if (!args.parallel.empty()) run.sets.push_back("parallel.mode=" + args.parallel);
    if (!args.device.empty()) run.sets.push_back("training.device=" + args.device);
    auto cfg = loom::train::TrainConfig::load(use_saved ? saved_config.string() : args.config, run.sets);
    // One process is one rank: a mesh of several ranks runs under mpirun or srun (docs/mesh.md).
    const loom::dist::LaunchedRank rank = loom::train::start_ranks(cfg, !args.no_overlap);
    run.rank_context = rank.context;
    const bool writer = !rank.context || rank.context->rank == 0;
    run.existing = args.resume      ? loom::runs::ExistingRun::Resume
                   : args.overwrite ? loom::runs::ExistingRun::Overwrite
                                    : loom::runs::ExistingRun::Refuse;
    run.weights = args.weights;
    // A test hook: LOOM_TEST_CHECKPOINT_PAUSE_MS=N sleeps N ms before each checkpoint file, widening the
    // window in which the crash test's kill -9 lands mid-checkpoint.
    if (const char* pause = std::getenv("LOOM_TEST_CHECKPOINT_PAUSE_MS"); pause && writer) {
      const int ms = std::atoi(pause);
      run.before_checkpoint_file = [ms](const std::string&) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
    }
    loom::train::TrainRunEvents events;
    events.note = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    events.ended = print_end;
    events.sample = [&cfg](int64_t i, const std::string& text) {
      std::printf("--- sample %lld ---\n%s%s\n", static_cast<long long>(i + 1), cfg.sample.prompt.c_str(), text.c_str());
    };
    loom::train::TrainOutcome outcome;
    try {
      run.budget = loom::runs::MemoryBudget::from_setting(args.max_memory);
      outcome = loom::train::run_training(cfg, run, events);
    } catch (const std::exception& e) {
      // One rank cannot go on while the others wait for it in a collective: end the whole job now.
      if (!rank.context) throw;
      loom::dist::mpi_abort(loom::str("error: rank ", rank.context->rank, ": ", e.what()), loom::cli::kExitError);
    }
    if (!outcome.stopped) return;
    if (outcome.writer && !outcome.summary.stopped_early) {  // the training is complete, the samples are not
      std::fprintf(stderr, "interrupted after training finished (samples skipped)\n");
    }
    throw loom::cli::ExitStatus{loom::cli::exit_status_for_signal(outcome.signal ? outcome.signal : SIGINT)};
  });
});

}  // namespace
