// `loom train`: with no arguments, the default job end to end (tokenizer, data, training, samples).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <thread>

#include "backends/backend.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "mesh/mesh.h"
#include "mesh/mpi.h"
#include "parallel/runtime.h"
#include "generate/generate.h"
#include "models/gguf.h"
#include "tokenizer/formats.h"
#include "runs/checkpoint.h"
#include "train/config_file.h"
#include "runs/memory.h"
#include "runs/load.h"
#include "runs/run_dir.h"
#include "train/run_data.h"
#include "train/trainer.h"

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
  std::string device = "cpu";
  bool no_overlap = false;
  std::string weights;
};

// `--weights PATH`: the model section becomes the weights' own (only model.context_length may still be
// set, it changes no parameter), and the data section points at the weights' tokenizer and token files
// made with it, in data/<weights name>/ unless --set names data.tokenizer/train/val. Returns the loaded
// weights, whose parameters are copied into the trainer's model before step 0.
loom::runs::LoadedRun start_from_weights(loom::train::TrainConfig& cfg, const TrainArgs& args,
                                          const loom::runs::MemoryBudget& budget) {
  auto loaded = loom::runs::load_weights(args.weights, budget);
  LOOM_CHECK(loaded.tokenizer.has_value(), "train --weights: ", args.weights,
             " has no tokenizer (a GGUF with tokenizer metadata, an HF directory with tokenizer.json, or a "
             "weights file with tokenizer.json beside it)");
  nlohmann::json model = loaded.model->model_config().json();
  bool data_set = false;
  for (const std::string& s : args.sets) {
    if (s.rfind("model.", 0) == 0) {
      const size_t eq = s.find('=');
      LOOM_CHECK(s.rfind("model.context_length=", 0) == 0, "train --weights: --set ", s.substr(0, eq),
                 " would change the model the weights describe (only model.context_length may be set)");
      model["context_length"] = cfg.model.context_length();
    }
    data_set |= s.rfind("data.tokenizer=", 0) == 0 || s.rfind("data.train=", 0) == 0 || s.rfind("data.val=", 0) == 0;
  }
  cfg.model = loom::models::ModelConfig::from_json(model);
  if (!data_set) {
    const fs::path dir = fs::path("data") / fs::path(args.weights).filename().replace_extension();
    cfg.data.tokenizer = (dir / "tokenizer.json").string();
    cfg.data.train = (dir / "train.bin").string();
    cfg.data.val = (dir / "val.bin").string();
  }
  fs::create_directories(fs::path(cfg.data.tokenizer).parent_path().empty() ? fs::path(".")
                                                                              : fs::path(cfg.data.tokenizer).parent_path());
  if (!fs::exists(cfg.data.tokenizer)) loom::tokenizer::save_hf_json(*loaded.tokenizer, cfg.data.tokenizer);
  return loaded;
}

void print_samples(const loom::train::TrainConfig& cfg, const loom::models::LanguageModel& model,
                   const loom::tokenizer::Tokenizer& tok) {
  const auto& s = cfg.sample;
  loom::generate::GenerateOptions o;
  o.max_new_tokens = s.max_new_tokens;
  o.sampling = {static_cast<float>(s.temperature), s.top_k, static_cast<float>(s.top_p)};
  auto eot = tok.special_token_id("<|endoftext|>");
  if (eot) o.stop_token = static_cast<int32_t>(*eot);
  std::vector<int32_t> prompt;
  for (auto id : tok.encode(s.prompt)) prompt.push_back(static_cast<int32_t>(id));
  for (int64_t i = 0; i < s.num_samples; ++i) {
    o.seed = cfg.training.seed + static_cast<uint64_t>(i);
    auto ids = loom::generate::generate(model, prompt, o);
    std::vector<loom::tokenizer::TokenId> out(ids.begin(), ids.end());
    std::printf("--- sample %lld ---\n%s%s\n", static_cast<long long>(i + 1), s.prompt.c_str(), tok.decode(out).c_str());
  }
}

TrainArgs args;  // filled by CLI11 when `train` parses

void run_training(loom::train::TrainConfig& cfg, const std::string& out, bool writer,
                  const std::shared_ptr<loom::dist::RankContext>& rank_context);

// The rank context of a multi-rank run (nullptr for one rank alone): the mesh must use exactly the ranks
// that mpirun or srun started.
std::shared_ptr<loom::dist::RankContext> start_ranks(loom::train::TrainConfig& cfg,
                                                     std::shared_ptr<loom::dist::Communicator>& comm) {
  const loom::dist::Mesh mesh = loom::dist::Mesh::parse(cfg.parallel.mesh);
  const int64_t launched = loom::dist::launched_ranks();
  if (mesh.size() == 1 && launched == 1) return nullptr;
  if (!loom::dist::mpi_built()) {
    loom::dist::validate_mesh_for_ranks(mesh, 1, "this loom, built without MPI, (one process)");
    LOOM_FAIL("this loom was built without MPI, so it cannot join the ", launched, " ranks its launcher started: "
              "install openmpi-bin libopenmpi-dev and rebuild");
  }
  comm = loom::dist::mpi_world();
  loom::dist::validate_mesh_for_ranks(mesh, comm->size(), launched > 1 ? "the launcher" : "loom (one process, not under mpirun or srun)");
  if (cfg.training.threads == 0) {
    // Share the machine's cores among the ranks on it instead of each taking all of them.
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (local == nullptr) local = std::getenv("SLURM_NTASKS_PER_NODE");
    const int per_node = local ? std::max(1, std::atoi(local)) : 1;
    cfg.training.threads = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / per_node);
  }
  auto context = std::make_shared<loom::dist::RankContext>(loom::dist::RankContext{
      mesh, loom::dist::parallel_mode_from_name(cfg.parallel.mode), comm.get(), comm->rank()});
  context->overlap = !args.no_overlap;
  context->max_expert_rows = cfg.parallel.max_expert_rows;
  return context;
}

loom::cli::Register reg("train", "Train a model (default: the small Llama-style model on Jane Austen)", [](CLI::App& cmd) {
  cmd.add_option("--config", args.config,
                 "preset (tiny, default, cs336-tinystories, gpt2-austen, gpt2-small, ...) or a JSON file (its missing "
                 "keys come from the preset its \"base\" key names, else the built-in defaults, as a preset's do; "
                 "relative paths resolve against the working directory; `loom config` prints it resolved)");
  cmd.add_option("--out", args.out, "run directory (default: runs/<preset or file name>)");
  auto* config_opt = cmd.get_option("--config");
  cmd.add_option("--set", args.sets, "override a config key: --set optimizer.lr=3e-4 (repeatable)");
  cmd.add_option("--mesh", args.mesh,
                 "device mesh, e.g. data=4,tensor=2 or data=2,expert=2 (config key parallel.mesh); its size must equal the number of "
                 "ranks mpirun/srun started (docs/mesh.md)");
  cmd.add_option("--parallel", args.parallel, "parallel mode: dp, fsdp, tp, fsdp_tp, dp_ep or fsdp_ep (config key parallel.mode)");
  cmd.add_option("--device", args.device,
                 "cpu (default), cuda or cuda:N; CUDA is refused with the reason until the models run there (docs/cuda.md)");
  cmd.add_flag("--no-overlap", args.no_overlap,
               "on a mesh: wait on every collective where it is issued instead of overlapping communication with "
               "compute (docs/mesh.md; the results are the same bits either way)");
  cmd.add_option("--max-memory", args.max_memory,
                 "memory the run may use, e.g. 8G (default: MemAvailable); a config estimated above it is refused");
  auto* resume_opt = cmd.add_flag("--resume", args.resume,
                                  "continue from the newest valid checkpoint in --out (its config.json is the config "
                                  "unless --config is given; --set still applies)");
  cmd.add_option("--weights", args.weights,
                 "start from these weights, with their tokenizer: a GGUF file, a Hugging Face directory or a loom weights "
                 "file (the model section is theirs; token files go to data/<weights name>/)")
      ->excludes(resume_opt);
  cmd.add_flag("--overwrite", args.overwrite,
               "replace the loom run in --out: its files and checkpoints are deleted (files loom did not write stay)")
      ->excludes(resume_opt);
  cmd.callback([config_opt] {
    loom::model_device(args.device, "train");  // before anything is read or written
    std::string out = args.out.empty() ? "runs/" + fs::path(args.config).stem().string() : args.out;
    const fs::path saved_config = fs::path(out) / "config.json";
    const bool use_saved = args.resume && config_opt->count() == 0 && fs::exists(saved_config);
    std::vector<std::string> sets = args.sets;
    if (!args.mesh.empty()) sets.push_back("parallel.mesh=" + args.mesh);
    if (!args.parallel.empty()) sets.push_back("parallel.mode=" + args.parallel);
    auto cfg = loom::train::TrainConfig::load(use_saved ? saved_config.string() : args.config, sets);
    // One process is one rank: a mesh of several ranks runs under mpirun or srun (docs/mesh.md).
    std::shared_ptr<loom::dist::Communicator> comm;
    std::shared_ptr<loom::dist::RankContext> rank_context = start_ranks(cfg, comm);
    const bool writer = !rank_context || rank_context->rank == 0;
    try {
      run_training(cfg, out, writer, rank_context);
    } catch (const loom::cli::ExitStatus&) {
      throw;
    } catch (const std::exception& e) {
      // One rank cannot go on while the others wait for it in a collective: end the whole job now.
      if (!rank_context) throw;
      loom::dist::mpi_abort(loom::str("error: rank ", rank_context->rank, ": ", e.what()), loom::cli::kExitError);
    }
  });
});

void run_training(loom::train::TrainConfig& cfg, const std::string& out, bool writer,
                  const std::shared_ptr<loom::dist::RankContext>& rank_context) {
    // Before any compute: the whole run's memory (runs/memory.h), then where the data paths point.
    const auto budget = loom::runs::MemoryBudget::from_setting(args.max_memory);
    std::optional<loom::runs::LoadedRun> init;
    if (!args.weights.empty()) {
      // Every rank would convert the same file and write the same tokenizer: one process for now.
      LOOM_CHECK(!rank_context, "train --weights ", args.weights, " runs on one process; start it without mpirun, "
                 "export a loom run, then train that on the mesh");
      init = start_from_weights(cfg, args, budget);
    }
    loom::runs::check_memory(loom::train::training_memory(cfg), budget, "train");
    auto* comm = rank_context ? rank_context->comm : nullptr;
    // Rank 0 owns the run directory and the data preparation; the others wait for it.
    std::optional<loom::runs::RunDir> run_dir;
    if (writer) {
      for (const auto& line : loom::train::describe_data_paths(cfg)) std::fprintf(stderr, "%s\n", line.c_str());
      // Refuses a directory that is not loom's, or an existing run without --resume/--overwrite, and locks
      // it for the rest of the process (runs/run_dir.h).
      using loom::runs::ExistingRun;
      run_dir.emplace(loom::runs::RunDir::claim(
          out, loom::runs::RunKind::Train,
          args.resume ? ExistingRun::Resume : args.overwrite ? ExistingRun::Overwrite : ExistingRun::Refuse));
      for (const auto& line : loom::train::ensure_training_data(cfg)) std::fprintf(stderr, "%s\n", line.c_str());
    }
    if (comm) comm->barrier(comm->world());
    loom::train::Trainer trainer(cfg, out, budget, rank_context);
    // A test hook: LOOM_TEST_CHECKPOINT_PAUSE_MS=N sleeps N ms before each checkpoint file, widening the
    // window in which the crash test's kill -9 lands mid-checkpoint.
    if (const char* pause = std::getenv("LOOM_TEST_CHECKPOINT_PAUSE_MS"); pause && writer) {
      const int ms = std::atoi(pause);
      trainer.before_checkpoint_file = [ms](const std::string&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      };
    }
    if (init) {
      for (loom::nn::Parameter* p : init->model->parameters()) trainer.model().load_parameter(p->name, p->value);
      std::fprintf(stderr, "starting from the weights of %s\n", args.weights.c_str());
    }
    if (args.resume) {
      auto step = trainer.resume([writer](const std::string& path, const std::string& why) {
        if (writer) std::fprintf(stderr, "skipping checkpoint %s: %s\n", path.c_str(), why.c_str());
      });
      if (!writer) {
      } else if (step) {
        std::fprintf(stderr, "resuming from step %lld (%s)\n", static_cast<long long>(*step),
                     (fs::path(loom::runs::checkpoints_dir(out)) / loom::runs::checkpoint_name(*step)).c_str());
      } else {
        run_dir->check_nothing_to_resume();  // only a new or empty directory may start from step 0
        std::fprintf(stderr, "no checkpoint in %s (a new run): starting from step 0\n", out.c_str());
      }
    }
    if (writer) {
      if (auto removed = run_dir->start(); !removed.empty()) {
        std::fprintf(stderr, "--overwrite: deleted %zu file(s) of the previous run in %s\n", removed.size(), out.c_str());
      }
      std::fprintf(stderr, "training %lld parameters for %lld steps -> %s\n",
                   static_cast<long long>(cfg.model.stats().total_params), static_cast<long long>(cfg.training.max_steps),
                   out.c_str());
      if (rank_context) {
        std::fprintf(stderr, "mesh %s, mode %s: %d ranks over %s\n", rank_context->mesh.str().c_str(),
                     loom::dist::parallel_mode_name(rank_context->mode), comm->size(), comm->kind().c_str());
      }
    }
    if (comm) comm->barrier(comm->world());
    loom::train::StopSignal stop;
    auto summary = trainer.run(&stop);
    trainer.save_weights((fs::path(out) / "model.safetensors").string());  // gathered when sharded
    if (!writer) {
      if (summary.stopped_early) throw loom::cli::ExitStatus{loom::cli::exit_status_for_signal(stop.signal() ? stop.signal() : SIGINT)};
      return;
    }
    loom::train::save_run_tokenizer(cfg, out);
    if (init && init->tokenizer && (init->eos || !init->chat_template.empty())) {  // a GGUF's eos and chat template
      loom::models::write_tokenizer_config(out, *init->tokenizer, std::nullopt, init->eos, init->chat_template,
                                           cfg.model.context_length());
    }
    if (summary.stopped_early) {
      std::fprintf(stderr, "interrupted at step %lld of %lld (%lld skipped), %.0f tokens/s\nweights: %s/model.safetensors\n"
                   "continue with: loom train --out %s --resume\n",
                   static_cast<long long>(summary.steps_completed), static_cast<long long>(cfg.training.max_steps),
                   static_cast<long long>(summary.steps_skipped), summary.tokens_per_s, out.c_str(), out.c_str());
      run_dir->finish(loom::runs::RunState::Interrupted, summary.steps_completed);
      throw loom::cli::ExitStatus{loom::cli::exit_status_for_signal(stop.signal() ? stop.signal() : SIGINT)};
    }
    std::fprintf(stderr, "done: %lld steps (%lld skipped), %.0f tokens/s", static_cast<long long>(summary.steps_completed),
                 static_cast<long long>(summary.steps_skipped), summary.tokens_per_s);
    if (summary.first_val_loss && summary.last_val_loss) {
      std::fprintf(stderr, ", validation loss %.4f -> %.4f", *summary.first_val_loss, *summary.last_val_loss);
    }
    std::fprintf(stderr, "\nweights: %s/model.safetensors\n", out.c_str());
    run_dir->finish(loom::runs::RunState::Finished, summary.steps_completed);
    if (cfg.sample.num_samples > 0 && !stop.requested()) {
      // A sharded model generates only with its peers: rank 0 samples from the gathered weights instead.
      auto whole = rank_context ? loom::runs::load_model_weights((fs::path(out) / "model.safetensors").string())
                                : nullptr;
      print_samples(cfg, whole ? *whole : trainer.model(), loom::tokenizer::load_tokenizer(cfg.data.tokenizer));
    }
    if (stop.requested()) {  // after the last step: the training is complete, the samples are not
      std::fprintf(stderr, "interrupted after training finished (samples skipped)\n");
      throw loom::cli::ExitStatus{loom::cli::exit_status_for_signal(stop.signal() ? stop.signal() : SIGINT)};
    }
}

}  // namespace
