// `loom finetune`: supervised fine-tuning of a pretrained model on chat data (LoRA or full), and `loom
// merge`: an adapter merged into its base as a run `loom export` converts. What they do is
// train/finetune.h's; this file reads the options and prints the outcome.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "cli/exit_codes.h"
#include "core/error.h"
#include "io/json.h"
#include "train/finetune.h"

namespace {
namespace fs = std::filesystem;

struct FinetuneArgs {
  std::string weights, run, data, val_data, out, config, max_memory;
  std::vector<std::string> sets;
  std::string targets;
  int64_t rank = 0, max_steps = 0;
  double alpha = 0, dropout = -1, lr = 0;
  bool full = false, resume = false, overwrite = false;
};
FinetuneArgs args;

loom::cli::Register reg("finetune", "Fine-tune a pretrained model on chat data (JSON Lines): LoRA adapters, or --full",
                        [](CLI::App& cmd) {
  auto* weights = loom::cli::in_path(cmd.add_option("--weights", args.weights,
                                                    "the base model: a GGUF file, a Hugging Face directory or a loom weights file"),
                                     "weights");
  auto* run = loom::cli::in_dir(cmd.add_option("--run", args.run, "the base model: a loom run directory (trained, imported or merged)"),
                                "run");
  weights->excludes(run);
  loom::cli::in_file(cmd.add_option("--data", args.data,
                                    "training data, JSON Lines: {\"messages\": [{\"role\", \"content\"}, ...]} or "
                                    "{\"prompt\", \"completion\"}"),
                     "chat-jsonl");
  loom::cli::in_file(cmd.add_option("--val-data", args.val_data, "held-out data (default: data.val_fraction of --data, 0.1)"),
                     "chat-jsonl");
  loom::cli::out_dir(cmd.add_option("--out", args.out, "run directory (default: runs/finetune-<data name>)"), "finetune");
  loom::cli::in_file(cmd.add_option("--config", args.config, "a JSON file of fine-tuning settings (`loom finetune --help` lists the flags; "
                 "the file's sections: base, data, lora, optimizer, training, eval, checkpoint, logging)"),
                     "config");
  cmd.add_flag("--full", args.full, "train every weight instead of LoRA adapters");
  loom::cli::in_range(cmd.add_option("--lora-rank", args.rank, "LoRA rank r (default 8)"), 1, 65536);
  loom::cli::in_range(cmd.add_option("--lora-alpha", args.alpha, "LoRA alpha: the update is scaled by alpha / r (default 16)"), 1e-6, 1e6);
  loom::cli::in_range(cmd.add_option("--lora-dropout", args.dropout, "dropout on the adapters' input (default 0)"), 0, 1, false);
  cmd.add_option("--lora-targets", args.targets,
                 "layers that get adapters, comma-separated, loom's or Hugging Face's names: q_proj,k_proj,v_proj,o_proj "
                 "(default), gate_proj, up_proj, down_proj, ..., experts (DeepSeek-V3's routed experts), or all-linear");
  loom::cli::in_range(cmd.add_option("--max-steps", args.max_steps, "optimizer steps (default 100)"), 1, 100000000);
  loom::cli::in_range(cmd.add_option("--lr", args.lr, "peak learning rate (default 2e-4)"), 0, 10);
  cmd.add_option("--set", args.sets, "override a setting: --set training.batch_size=8 (repeatable)");
  cmd.add_option("--max-memory", args.max_memory, "memory the run may use, e.g. 8G (default: MemAvailable)");
  auto* resume = cmd.add_flag("--resume", args.resume, "continue the run in --out from its newest valid checkpoint");
  cmd.add_flag("--overwrite", args.overwrite, "replace the loom run in --out")->excludes(resume);
  cmd.callback([] {
    std::vector<std::string> sets;
    if (!args.weights.empty() || !args.run.empty()) sets.push_back("base.weights=" + (args.run.empty() ? args.weights : args.run));
    if (!args.data.empty()) sets.push_back("data.train=" + args.data);
    if (!args.val_data.empty()) sets.push_back("data.val=" + args.val_data);
    if (args.full) sets.push_back("lora.full=true");
    if (args.rank > 0) sets.push_back("lora.rank=" + std::to_string(args.rank));
    if (args.alpha > 0) sets.push_back(loom::str("lora.alpha=", args.alpha));
    if (args.dropout >= 0) sets.push_back(loom::str("lora.dropout=", args.dropout));
    if (!args.targets.empty()) sets.push_back("lora.targets=" + args.targets);
    if (args.max_steps > 0) sets.push_back("training.max_steps=" + std::to_string(args.max_steps));
    if (args.lr > 0) sets.push_back(loom::str("optimizer.lr=", args.lr));
    sets.insert(sets.end(), args.sets.begin(), args.sets.end());
    const std::string out = !args.out.empty() ? args.out
                            : "runs/finetune-" + fs::path(args.data.empty() ? std::string("data") : args.data).stem().string();
    nlohmann::json base = nlohmann::json::object();
    if (!args.config.empty()) {
      base = loom::io::read_json_file(args.config, "fine-tuning config");
    } else if (args.resume && fs::exists(fs::path(out) / "config.json")) {
      base = loom::io::read_json_file((fs::path(out) / "config.json").string(), "fine-tuning config");
    }
    // The settings' own messages name config keys; say which flag or file they came from.
    const auto config = [&] {
      try {
        return loom::train::FinetuneConfig::with_overrides(base, sets);
      } catch (const loom::Error& e) {
        const std::string what = e.what();
        if (!args.targets.empty() && what.find("lora.targets") != std::string::npos) {
          throw loom::Error("finetune: --lora-targets: " + what);
        }
        if (!args.config.empty()) throw loom::Error("finetune: --config " + args.config + ": " + what);
        throw;
      }
    }();
    loom::train::FinetuneRunOptions o;
    o.out = out;
    o.existing = args.resume ? loom::runs::ExistingRun::Resume
                 : args.overwrite ? loom::runs::ExistingRun::Overwrite
                                  : loom::runs::ExistingRun::Refuse;
    o.budget = loom::runs::MemoryBudget::from_setting(args.max_memory);
    const auto s = [&] {
      try {
        return loom::train::run_finetune(config, o, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
      } catch (const loom::Error& e) {
        // A target is checked against the model's layers once it is loaded.
        const std::string what = e.what();
        if (!args.targets.empty() && what.find("LoRA: target") != std::string::npos) {
          throw loom::Error("finetune: --lora-targets: " + what);
        }
        throw;
      }
    }();
    if (s.stopped_early) {
      std::fprintf(stderr, "interrupted at step %lld; continue with: loom finetune --out %s --resume\n",
                   static_cast<long long>(s.steps_completed), out.c_str());
      throw loom::cli::ExitStatus{loom::cli::exit_status_for_signal(SIGINT)};
    }
    std::fprintf(stderr, "done: %lld steps, %.0f trained tokens/s, %.1f s", static_cast<long long>(s.steps_completed),
                 s.tokens_per_s, s.seconds);
    if (s.first_val_loss && s.last_val_loss) std::fprintf(stderr, ", held-out loss %.4f -> %.4f", *s.first_val_loss, *s.last_val_loss);
    if (s.exact_match_before && s.exact_match_after) {
      std::fprintf(stderr, ", exact match %.1f%% -> %.1f%% of %lld", *s.exact_match_before * 100, *s.exact_match_after * 100,
                   static_cast<long long>(s.exact_match_examples));
    }
    std::fprintf(stderr, "\n%s: %s\n", config.full ? "weights" : "adapter",
                 (fs::path(out) / (config.full ? "model.safetensors" : "adapter")).string().c_str());
  });
});

struct MergeArgs {
  std::string weights, adapter, out, max_memory;
  bool overwrite = false;
};
MergeArgs margs;

loom::cli::Register merge_reg("merge", "Merge a LoRA adapter (PEFT's files) into its base, as a run `loom export` converts",
                              [](CLI::App& cmd) {
  loom::cli::in_path(cmd.add_option("--weights", margs.weights,
                                    "the base: a GGUF file, a Hugging Face directory, a loom weights file or run"),
                     "weights")
      ->required();
  loom::cli::in_dir(cmd.add_option("--adapter", margs.adapter,
                                   "PEFT's adapter directory (adapter_config.json + adapter_model.safetensors)"),
                    "peft-adapter")
      ->required();
  loom::cli::out_dir(cmd.add_option("--out", margs.out, "the merged run directory"), "merge")->required();
  cmd.add_option("--max-memory", margs.max_memory, "memory the job may use, e.g. 8G (default: MemAvailable)");
  cmd.add_flag("--overwrite", margs.overwrite, "replace the loom run in --out");
  cmd.callback([] {
    loom::train::merge_adapter_run(margs.weights, margs.adapter, margs.out, margs.overwrite,
                                   loom::runs::MemoryBudget::from_setting(margs.max_memory));
    std::fprintf(stderr, "merged %s into %s -> %s (loom export --run %s --format hf|gguf)\n", margs.adapter.c_str(),
                 margs.weights.c_str(), margs.out.c_str(), margs.out.c_str());
  });
});

}  // namespace
