// `loom eval`: held-out loss and perplexity of a run on a token file, as one JSON line.
#include <cstdio>

#include "cli/command.h"
#include "train/evaluate.h"
#include "train/run.h"

namespace {

struct EvalArgs {
  std::string run, weights, data;
  int64_t context_length = 0, max_windows = 0;
};

loom::cli::Register reg("eval", "Test loss and perplexity over every complete window of a token file", [](CLI::App& cmd) {
  static EvalArgs a;
  auto* run = cmd.add_option("--run", a.run, "run directory");
  auto* weights = cmd.add_option("--weights", a.weights, "weights file");
  run->excludes(weights);
  cmd.add_option("--data", a.data, "token file (.bin, with meta.json beside it)")->required();
  cmd.add_option("--context-length", a.context_length, "window length T (default: the model's)");
  cmd.add_option("--max-windows", a.max_windows, "evaluate at most this many windows (0 = all)");
  cmd.callback([] {
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "eval: give --run DIR or --weights PATH");
    auto loaded = a.run.empty() ? loom::train::load_weights(a.weights) : loom::train::load_run(a.run);
    auto tokens = loom::data::TokenFile::open(a.data);
    auto r = loom::train::evaluate(*loaded.model, tokens, a.context_length, a.max_windows);
    std::printf("%s\n", r.to_json().c_str());
  });
});

}  // namespace
