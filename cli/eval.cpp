// `loom eval`: held-out loss and perplexity of a run on a token file, as one JSON line.
#include <cstdio>

#include "cli/command.h"
#include "core/autograd.h"
#include "io/safetensors.h"
#include "train/evaluate.h"
#include "runs/consistency.h"
#include "runs/memory.h"
#include "runs/load.h"

namespace {

struct EvalArgs {
  std::string run, weights, data, logits_out, max_memory;
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
  cmd.add_option("--logits-out", a.logits_out,
                 "also write the first window's inputs and logits to this safetensors file (ids [T], logits [T, V]), "
                 "for comparisons with other implementations");
  cmd.add_option("--max-memory", a.max_memory,
                 "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  cmd.callback([] {
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "eval: give --run DIR or --weights PATH");
    const auto budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    const std::string source = a.run.empty() ? a.weights : a.run;
    // The whole job's memory, checked from the model's config before the model is built.
    const auto job = [](const loom::models::ModelConfig& m) {
      return loom::runs::inference_memory(m, 8, a.context_length, a.logits_out.empty() ? 0 : m.context_length());
    };
    auto loaded = a.run.empty() ? loom::runs::load_weights(a.weights, budget, job)
                                : loom::runs::load_run(a.run, budget, job);
    auto tokens = loom::data::TokenFile::open(a.data);
    // Before any compute: the data was made by the run's tokenizer.
    const std::string note = loom::runs::check_eval_data(loaded, source, a.data);
    if (!note.empty()) std::fprintf(stderr, "note: %s\n", note.c_str());
    loom::runs::check_memory(job(loaded.model->model_config()), budget, "eval");  // an HF import's model
    auto r = loom::train::evaluate(*loaded.model, tokens, a.context_length, a.max_windows);
    if (!a.logits_out.empty()) {
      const int64_t T = a.context_length > 0 ? a.context_length : loaded.model->context_length();
      LOOM_CHECK(tokens.size() > T, "eval: --logits-out needs at least ", T + 1, " tokens, the file has ", tokens.size());
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(tokens[i]);
      loom::Tensor x = loom::Tensor::from_vector<int32_t>({1, T}, ids);
      loom::autograd::NoGradGuard no_grad;
      loom::Tensor logits = loaded.model->logits(x).detach();
      loom::io::write_safetensors(a.logits_out, loom::io::NamedTensors{{"ids", x.view({T})},
                                                                        {"logits", logits.view({T, logits.shape()[2]})}});
    }
    std::printf("%s\n", r.to_json().c_str());
  });
});

}  // namespace
