#include "train/run.h"

#include "parallel/pipeline.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "generate/generate.h"
#include "generate/text.h"
#include "models/gguf.h"
#include "tokenizer/formats.h"
#include "train/config_file.h"
#include "train/device.h"
#include "train/memory.h"
#include "train/run_data.h"
#include "train/stop_signal.h"

namespace loom::train {
namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config) { return "runs/" + fs::path(config).stem().string(); }

runs::LoadedRun start_from_weights(TrainConfig& cfg, const std::string& weights, const std::vector<std::string>& sets,
                                   const runs::MemoryBudget& budget) {
  auto loaded = runs::load_weights(weights, budget);
  LOOM_CHECK(loaded.tokenizer.has_value(), "train --weights: ", weights,
             " has no tokenizer (a GGUF with tokenizer metadata, an HF directory with tokenizer.json, or a "
             "weights file with tokenizer.json beside it)");
  nlohmann::json model = loaded.model->model_config().json();
  bool data_set = false;
  for (const std::string& s : sets) {
    if (s.rfind("model.", 0) == 0) {
      const size_t eq = s.find('=');
      LOOM_CHECK(s.rfind("model.context_length=", 0) == 0, "train --weights: --set ", s.substr(0, eq),
                 " would change the model the weights describe (only model.context_length may be set)");
      model["context_length"] = cfg.model.context_length();
    }
    data_set |= s.rfind("data.tokenizer=", 0) == 0 || s.rfind("data.train=", 0) == 0 || s.rfind("data.val=", 0) == 0;
  }
  cfg.model = models::ModelConfig::from_json(model);
  if (!data_set) {
    const fs::path dir = fs::path("data") / fs::path(weights).filename().replace_extension();
    cfg.data.tokenizer = (dir / "tokenizer.json").string();
    cfg.data.train = (dir / "train.bin").string();
    cfg.data.val = (dir / "val.bin").string();
  }
  fs::create_directories(fs::path(cfg.data.tokenizer).parent_path().empty() ? fs::path(".")
                                                                              : fs::path(cfg.data.tokenizer).parent_path());
  if (!fs::exists(cfg.data.tokenizer)) tokenizer::save_hf_json(*loaded.tokenizer, cfg.data.tokenizer);
  return loaded;
}

void generate_samples(const TrainConfig& cfg, const models::LanguageModel& model, const tokenizer::Tokenizer& tok,
                      const std::function<void(int64_t index, const std::string& text)>& on_sample) {
  const auto& s = cfg.sample;
  generate::GenerateOptions o;
  o.max_new_tokens = s.max_new_tokens;
  o.sampling = {static_cast<float>(s.temperature), s.top_k, static_cast<float>(s.top_p)};
  o.stop_token = generate::default_stop_token(tok);
  const std::vector<int32_t> prompt = generate::prompt_ids(tok, s.prompt);
  for (int64_t i = 0; i < s.num_samples; ++i) {
    o.seed = cfg.training.seed + static_cast<uint64_t>(i);
    auto ids = generate::generate(model, prompt, o);
    std::vector<tokenizer::TokenId> out(ids.begin(), ids.end());
    const std::string text = tok.decode(out);
    if (on_sample) on_sample(i, text);
  }
}

dist::LaunchedRank start_ranks(TrainConfig& cfg, bool overlap) {
  const dist::Mesh mesh = dist::Mesh::parse(cfg.parallel.mesh);
  dist::LaunchedRank r = dist::join_launched_ranks(mesh, dist::parallel_mode_from_name(cfg.parallel.mode));
  if (!r.context) return r;
  // Share the machine's cores among the ranks on it instead of each taking all of them.
  if (cfg.training.threads == 0) cfg.training.threads = dist::threads_per_local_rank();
  r.context->overlap = overlap;
  r.context->max_expert_rows = cfg.parallel.max_expert_rows;
  r.context->pipe_schedule = cfg.parallel.schedule;
  r.context->pipe_chunks = cfg.parallel.virtual_stages;
  if (!cfg.parallel.pipe_layers.empty()) {
    r.context->pipe_bounds = dist::stage_bounds_from_counts(cfg.parallel.pipe_layers, cfg.model.json().value("num_layers", int64_t{0}),
                                                            mesh.pipe * cfg.parallel.virtual_stages);
  }
  return r;
}

TrainOutcome run_training(TrainConfig& cfg, const TrainRunOptions& options, const TrainRunEvents& events) {
  const std::string& out = options.out;
  const auto& rank_context = options.rank_context;
  const bool writer = !rank_context || rank_context->rank == 0;
  auto note = [&](const std::string& line) {
    if (writer && events.note) events.note(line);
  };
  // The device first, before --weights converts a file and writes its tokenizer (train/device.h).
  const Device device = training_device(cfg.training.device, cfg.parallel.mesh, "train");
  // Before any compute: the whole run's memory (runs/memory.h), then where the data paths point.
  std::optional<runs::LoadedRun> init;
  if (!options.weights.empty()) {
    // Every rank would convert the same file and write the same tokenizer: one process for now.
    LOOM_CHECK(!rank_context, "train --weights ", options.weights, " runs on one process; start it without mpirun, "
               "export a loom run, then train that on the mesh");
    init = start_from_weights(cfg, options.weights, options.sets, options.budget);
  }
  runs::check_memory(training_memory(cfg), memory_budget(device, options.budget), "train");
  auto* comm = rank_context ? rank_context->comm : nullptr;
  // Rank 0 owns the run directory and the data preparation; the others wait for it.
  std::optional<runs::RunDir> run_dir;
  if (writer) {
    for (const auto& line : describe_data_paths(cfg)) note(line);
    // Refuses a directory that is not loom's, or an existing run without Resume/Overwrite, and locks it
    // until this function returns (runs/run_dir.h).
    run_dir.emplace(runs::RunDir::claim(out, runs::RunKind::Train, options.existing));
    for (const auto& line : ensure_training_data(cfg, options.data_progress)) note(line);
  }
  if (comm) comm->barrier(comm->world());
  Trainer trainer(cfg, out, options.budget, rank_context);
  if (options.before_checkpoint_file) trainer.before_checkpoint_file = options.before_checkpoint_file;
  if (init) {
    for (nn::Parameter* p : init->model->parameters()) trainer.model().load_parameter(p->name, p->value);
    note(str("starting from the weights of ", options.weights));
  }
  if (options.existing == runs::ExistingRun::Resume) {
    auto step = trainer.resume([&](const std::string& path, const std::string& why) {
      note(str("skipping checkpoint ", path, ": ", why));
    });
    if (step) {
      note(str("resuming from step ", *step, " (",
               (fs::path(runs::checkpoints_dir(out)) / runs::checkpoint_name(*step)).string(), ")"));
    } else if (writer) {
      run_dir->check_nothing_to_resume();  // only a new or empty directory may start from step 0
      note(str("no checkpoint in ", out, " (a new run): starting from step 0"));
    }
  }
  if (writer) {
    if (auto removed = run_dir->start(); !removed.empty()) {
      note(str("--overwrite: deleted ", removed.size(), " file(s) of the previous run in ", out));
    }
    note(str("training ", cfg.model.stats().total_params, " parameters for ", cfg.training.max_steps, " steps -> ", out));
    if (rank_context) {
      note(str("mesh ", rank_context->mesh.str(), ", mode ", dist::parallel_mode_name(rank_context->mode), ": ",
               comm->size(), " ranks over ", comm->kind()));
    }
  }
  if (comm) comm->barrier(comm->world());
  StopSignal stop;
  TrainOutcome outcome;
  outcome.summary = trainer.run(&stop);
  outcome.max_steps = cfg.training.max_steps;
  outcome.run_dir = out;
  outcome.weights_path = (fs::path(out) / "model.safetensors").string();
  outcome.writer = writer;
  trainer.save_weights(outcome.weights_path);  // gathered when sharded
  const TrainSummary& summary = outcome.summary;
  if (!writer) {
    outcome.stopped = summary.stopped_early;
    outcome.signal = stop.signal();
    return outcome;
  }
  save_run_tokenizer(cfg, out);
  if (init && init->tokenizer && (init->eos || !init->chat_template.empty())) {  // a GGUF's eos and chat template
    models::write_tokenizer_config(out, *init->tokenizer, std::nullopt, init->eos, init->chat_template,
                                   cfg.model.context_length());
  }
  outcome.stopped = summary.stopped_early;
  outcome.signal = stop.signal();
  run_dir->finish(summary.stopped_early ? runs::RunState::Interrupted : runs::RunState::Finished,
                  summary.steps_completed);
  if (events.ended) events.ended(outcome);
  if (summary.stopped_early) return outcome;
  if (options.samples && cfg.sample.num_samples > 0 && !stop.requested()) {
    // A sharded model generates only with its peers, and decoding runs on the CPU: rank 0 (or a GPU
    // run) samples from the saved weights instead.
    auto whole = rank_context || !trainer.device().is_cpu() ? runs::load_model_weights(outcome.weights_path) : nullptr;
    generate_samples(cfg, whole ? *whole : trainer.model(), tokenizer::load_tokenizer(cfg.data.tokenizer), events.sample);
  }
  // A stop after the last step: the training is complete, the samples are not.
  outcome.stopped = stop.requested();
  outcome.signal = stop.signal();
  return outcome;
}

}  // namespace loom::train
