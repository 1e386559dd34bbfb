// `loom generate`: sample text from a trained run or a weights file.
#include <cstdio>

#include "backends/backend.h"
#include "cli/command.h"
#include "core/error.h"
#include "generate/generate.h"
#include "generate/text.h"
#include "runs/load.h"
#include "runs/memory.h"
#include "tokenizer/text_stream.h"

namespace {

struct GenerateArgs {
  std::string run, weights, prompt, max_memory;
  int64_t max_new_tokens = 100;
  float temperature = 0.8f, top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool f32 = false;
  std::string device = "cpu";
};

loom::cli::Register reg("generate", "Sample text from a run (prefill, then KV-cache decoding)", [](CLI::App& cmd) {
  static GenerateArgs a;
  auto* run = loom::cli::in_dir(cmd.add_option("--run", a.run, "run directory (model.safetensors, tokenizer.json)"), "run");
  auto* weights = loom::cli::in_path(cmd.add_option("--weights", a.weights, "weights file (a tokenizer.json beside it is used), Hugging Face directory, or GGUF file"), "weights");
  run->excludes(weights);
  cmd.add_option("--prompt", a.prompt, "text to continue")->required();
  cmd.add_option("--max-new-tokens", a.max_new_tokens, "tokens to generate");
  cmd.add_option("--temperature", a.temperature, "0 = greedy");
  cmd.add_option("--top-k", a.top_k, "keep the k most likely tokens (0 = all)");
  cmd.add_option("--top-p", a.top_p, "keep the smallest set with this probability mass (1 = all)");
  cmd.add_option("--seed", a.seed, "sampling seed");
  cmd.add_flag("--f32", a.f32,
               "with a GGUF file: multiply in f32 by the dequantized weights (default: Q8_0/Q4_0/Q4_1/Q4_K/Q6_K "
               "matrices stay quantized and run on the integer kernels)");
  cmd.add_option("--device", a.device,
                 "cpu (default), cuda or cuda:N; CUDA is refused with the reason until the models run there (docs/cuda.md)");
  cmd.add_option("--max-memory", a.max_memory,
                 "memory the job may use, e.g. 8G (default: MemAvailable); a model estimated above it is refused");
  cmd.callback([] {
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "generate: give --run DIR or --weights PATH");
    loom::model_device(a.device, "generate");
    // Every option is checked before anything is printed (the prompt is echoed first).
    LOOM_CHECK(a.max_new_tokens >= 0, "generate: --max-new-tokens must be >= 0, got ", a.max_new_tokens);
    try {
      loom::generate::SamplingOptions{a.temperature, a.top_k, a.top_p}.validate();
    } catch (const loom::Error& e) {
      throw loom::Error(std::string("generate: ") + e.what());
    }
    const auto budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    // The KV cache of the whole context, checked from the model's config before the model is built.
    const auto job = [](const loom::models::ModelConfig& m) { return loom::runs::generation_memory(m); };
    auto loaded = loom::runs::load_for_job(a.run, a.weights, budget, job, "generate", /*quantized_gguf=*/!a.f32);
    LOOM_CHECK(loaded.tokenizer.has_value(), "generate: no tokenizer.json found beside the weights");
    const auto& tok = *loaded.tokenizer;
    loom::generate::GenerateOptions o;
    o.max_new_tokens = a.max_new_tokens;
    o.sampling = {a.temperature, a.top_k, a.top_p};
    o.seed = a.seed;
    o.stop_token = loom::generate::default_stop_token(tok, loaded.eos);  // a GGUF file's eos, else <|endoftext|>
    const std::vector<int32_t> prompt = loom::generate::prompt_ids(tok, a.prompt);
    LOOM_CHECK(!prompt.empty(), "generate: --prompt is empty (give at least one character to continue)");
    std::printf("%s", a.prompt.c_str());
    std::fflush(stdout);
    // Stream the text as it comes (a character whose bytes are split across tokens waits for its end).
    loom::tokenizer::TokenTextStream text(tok);
    loom::generate::generate(*loaded.model, prompt, o, [&](int32_t id) {
      const std::string complete = text.push(static_cast<loom::tokenizer::TokenId>(id));
      if (complete.empty()) return;
      std::fwrite(complete.data(), 1, complete.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("%s\n", text.finish().c_str());
  });
});

}  // namespace
