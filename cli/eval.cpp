// `loom eval`: held-out loss and perplexity of a run on a token file, as one JSON line
// (train/evaluate.h evaluate_run).
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "runs/memory.h"
#include "train/evaluate.h"

namespace {

struct EvalArgs {
  std::string run, weights, data, logits_out, max_memory;
  int64_t context_length = 0, max_windows = 0;
};

loom::cli::Register reg("eval", "Test loss and perplexity over every complete window of a token file", [](CLI::App& cmd) {
  static EvalArgs a;
  auto* run = loom::cli::in_dir(cmd.add_option("--run", a.run, "run directory"), "run");
  auto* weights = loom::cli::in_path(cmd.add_option("--weights", a.weights, "weights file"), "weights");
  run->excludes(weights);
  loom::cli::in_file(cmd.add_option("--data", a.data, "token file (.bin, with meta.json beside it)"), "tokens")->required();
  cmd.add_option("--context-length", a.context_length, "window length T (default: the model's)");
  cmd.add_option("--max-windows", a.max_windows, "evaluate at most this many windows (0 = all)");
  loom::cli::out_file(cmd.add_option("--logits-out", a.logits_out,
                 "also write the first window's inputs and logits to this safetensors file (ids [T], logits [T, V]), "
                 "for comparisons with other implementations"), "logits");
  cmd.add_option("--max-memory", a.max_memory,
                 "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  cmd.callback([] {
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "eval: give --run DIR or --weights PATH");
    loom::train::EvalRunOptions o;
    o.run = a.run;
    o.weights = a.weights;
    o.data = a.data;
    o.context_length = a.context_length;
    o.max_windows = a.max_windows;
    o.logits_out = a.logits_out;
    o.budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    const auto r = loom::train::evaluate_run(o, [](const std::string& note) { std::fprintf(stderr, "note: %s\n", note.c_str()); });
    std::printf("%s\n", r.to_json().c_str());
  });
});

}  // namespace
