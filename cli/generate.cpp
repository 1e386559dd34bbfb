// `loom generate`: sample text from a trained run or a weights file.
#include <cstdio>

#include "backends/backend.h"
#include "cli/command.h"
#include "generate/generate.h"
#include "tokenizer/pretokenizer.h"
#include "runs/memory.h"
#include "runs/load.h"

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
  auto* run = cmd.add_option("--run", a.run, "run directory (model.safetensors, tokenizer.json)");
  auto* weights = cmd.add_option("--weights", a.weights, "weights file (a tokenizer.json beside it is used), Hugging Face directory, or GGUF file");
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
    auto loaded = a.run.empty() ? loom::runs::load_weights(a.weights, budget, job, /*quantized_gguf=*/!a.f32)
                                : loom::runs::load_run(a.run, budget, job);
    loom::runs::check_memory(job(loaded.model->model_config()), budget, "generate");  // an HF import's model
    LOOM_CHECK(loaded.tokenizer.has_value(), "generate: no tokenizer.json found beside the weights");
    const auto& tok = *loaded.tokenizer;
    loom::generate::GenerateOptions o;
    o.max_new_tokens = a.max_new_tokens;
    o.sampling = {a.temperature, a.top_k, a.top_p};
    o.seed = a.seed;
    if (loaded.eos) {
      o.stop_token = static_cast<int32_t>(*loaded.eos);  // a GGUF file's end-of-sequence token
    } else if (auto eot = tok.special_token_id("<|endoftext|>")) {
      o.stop_token = static_cast<int32_t>(*eot);
    }
    std::vector<int32_t> prompt;
    for (auto id : tok.encode(a.prompt)) prompt.push_back(static_cast<int32_t>(id));
    LOOM_CHECK(!prompt.empty(), "generate: --prompt is empty (give at least one character to continue)");
    std::printf("%s", a.prompt.c_str());
    std::fflush(stdout);
    // Stream the text as it comes: print the bytes that form complete UTF-8 characters, hold back a
    // character whose bytes are split across tokens.
    std::string bytes;
    size_t printed = 0;
    loom::generate::generate(*loaded.model, prompt, o, [&](int32_t id) {
      bytes += tok.token_bytes(static_cast<loom::tokenizer::TokenId>(id));
      size_t complete = printed + loom::tokenizer::valid_utf8_prefix(std::string_view(bytes).substr(printed));
      if (complete > printed) {
        std::fwrite(bytes.data() + printed, 1, complete - printed, stdout);
        std::fflush(stdout);
        printed = complete;
      }
    });
    std::string rest = loom::tokenizer::replace_invalid_utf8(std::string_view(bytes).substr(printed));
    std::printf("%s\n", rest.c_str());
  });
});

}  // namespace
