// `loom chat`: a conversation with a model through its ChatML chat template, kept in the KV cache.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/command.h"
#include "cli/status.h"
#include "core/error.h"
#include "generate/chat.h"
#include "runs/load.h"
#include "runs/memory.h"
#include "quant/qmatmul.h"
#include "tokenizer/text_stream.h"

namespace {

struct ChatArgs {
  std::string run, weights, system, max_memory, activations;
  bool has_system = false, from_stdin = false, print_prompt = false, f32 = false, stats = false;
  int64_t max_new_tokens = 512;
  float temperature = 0.8f, top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted.store(true); }

// Ctrl-C during a reply stops that reply (the conversation goes on); at the prompt it ends the chat.
void catch_sigint(bool catching) {
  struct sigaction sa = {};
  sa.sa_handler = catching ? on_sigint : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

loom::cli::Register reg("chat", "Chat with a model through its ChatML chat template (GGUF or imported run)", [](CLI::App& cmd) {
  static ChatArgs a;
  auto* run = loom::cli::in_dir(cmd.add_option("--run", a.run, "run directory (model.safetensors, tokenizer.json, tokenizer_config.json)"), "run");
  auto* weights = loom::cli::in_path(cmd.add_option("--weights", a.weights, "GGUF file (or weights file / Hugging Face directory)"), "weights");
  run->excludes(weights);
  auto* sys = cmd.add_option("--system", a.system, "system message (default: the template's own, if it has one)");
  cmd.add_flag("--stdin", a.from_stdin, "read one user message from stdin and print only the reply (the default when stdin is not a terminal)");
  cmd.add_flag("--print-prompt", a.print_prompt, "print each turn's prefilled token ids to stderr");
  cmd.add_flag("--stats", a.stats, "print each turn's prefill and decode tokens/s to stderr");
  cmd.add_option("--max-new-tokens", a.max_new_tokens, "most tokens in one reply");
  loom::cli::in_range(cmd.add_option("--temperature", a.temperature, "0 = greedy"), 0, 1e6);
  cmd.add_option("--top-k", a.top_k, "keep the k most likely tokens (0 = all)");
  loom::cli::in_range(cmd.add_option("--top-p", a.top_p, "keep the smallest set with this probability mass (1 = all)"), 0, 1);
  cmd.add_option("--seed", a.seed, "sampling seed");
  cmd.add_flag("--f32", a.f32, "with a GGUF file: multiply by the dequantized weights in f32");
  cmd.add_option("--activations", a.activations,
                 "with weights kept quantized, how activations are rounded: int8x2 (the default, within ~0.01 of "
                 "--f32's logits) or int8 (llama.cpp's; faster prefill, less exact); docs/quant.md");
  cmd.add_option("--max-memory", a.max_memory, "memory the job may use, e.g. 8G (default: MemAvailable)");
  cmd.callback([sys] {
    a.has_system = sys->count() > 0;
    if (!a.activations.empty()) {
      loom::quant::set_default_activation_rounding(
          loom::quant::activation_rounding_from_name(a.activations, "chat: --activations"));
    }
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "chat: give --weights FILE.gguf or --run DIR");
    LOOM_CHECK(a.max_new_tokens >= 1 && a.max_new_tokens <= loom::generate::kMaxNewTokens,
               "chat: --max-new-tokens must be in [1, ", loom::generate::kMaxNewTokens, "], got ", a.max_new_tokens);
    try {
      loom::generate::SamplingOptions{a.temperature, a.top_k, a.top_p}.validate();
    } catch (const loom::Error& e) {
      throw loom::Error(std::string("chat: ") + e.what());
    }
    const auto budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    const auto job = [](const loom::models::ModelConfig& m) { return loom::runs::generation_memory(m); };
    // One message from stdin is read before the model is loaded: an empty stdin is an error at once, not
    // after seconds of loading (issue 32).
    const bool from_stdin = a.from_stdin || !isatty(STDIN_FILENO);
    std::string stdin_user;
    if (from_stdin) {
      stdin_user.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      while (!stdin_user.empty() && (stdin_user.back() == '\n' || stdin_user.back() == '\r')) stdin_user.pop_back();
      LOOM_CHECK(!stdin_user.empty(), "chat: stdin held no message");
    }
    auto loaded = [&] {
      loom::cli::Status status("chat: loading " + (a.run.empty() ? a.weights : a.run));
      return loom::runs::load_for_job(a.run, a.weights, budget, job, "chat", /*quantized_gguf=*/!a.f32);
    }();
    LOOM_CHECK(loaded.tokenizer.has_value(), "chat: no tokenizer found beside the weights");
    const auto& tok = *loaded.tokenizer;
    const loom::runs::ChatSettings settings = loom::runs::chat_settings(
        loaded, !a.run.empty() || !std::filesystem::is_directory(a.weights) ? a.run : a.weights);  // an HF directory's tokenizer_config.json
    auto tmpl = loom::generate::ChatTemplate::from_jinja(settings.chat_template);
    loom::generate::GenerateOptions g;
    g.max_new_tokens = a.max_new_tokens;
    g.sampling = {a.temperature, a.top_k, a.top_p};
    g.seed = a.seed;
    loom::generate::ChatSession chat(*loaded.model, tok, tmpl,
                                     a.has_system ? std::optional<std::string>(a.system) : std::nullopt, g,
                                     settings.eos);

    // One turn: stream the reply's complete UTF-8 characters as they come, holding back a character
    // whose bytes are split across tokens (tokenizer/text_stream.h).
    auto reply_to = [&](const std::string& user) {
      loom::tokenizer::TokenTextStream text(tok);
      g_interrupted.store(false);
      catch_sigint(true);
      loom::generate::ChatSession::Reply r;
      try {
        r = chat.turn(user, [&](int32_t id) {
          const std::string complete = text.push(static_cast<loom::tokenizer::TokenId>(id));
          if (complete.empty()) return;
          std::fwrite(complete.data(), 1, complete.size(), stdout);
          std::fflush(stdout);
        }, &g_interrupted);
      } catch (...) {
        catch_sigint(false);
        throw;
      }
      catch_sigint(false);
      if (a.print_prompt) {
        std::fprintf(stderr, "prompt ids:");
        for (int32_t id : chat.last_prefill()) std::fprintf(stderr, " %d", id);
        std::fprintf(stderr, "\n");
      }
      std::printf("%s\n", text.finish().c_str());
      std::fflush(stdout);
      if (a.stats) {
        const double n = static_cast<double>(chat.last_prefill().size()), d = static_cast<double>(r.tokens.size());
        std::fprintf(stderr, "[prefill %.0f tokens in %.3f s: %.1f tok/s; decode %.0f tokens in %.3f s: %.1f tok/s; %lld of %lld context tokens cached]\n",
                     n, r.prefill_seconds, n / r.prefill_seconds, d, r.decode_seconds,
                     r.decode_seconds > 0 ? d / r.decode_seconds : 0.0, static_cast<long long>(chat.cached()),
                     static_cast<long long>(chat.context_length()));
      }
      using Stop = loom::generate::ChatSession::Stop;
      if (r.stop == Stop::kInterrupted) std::fprintf(stderr, "[interrupted]\n");
      if (r.stop == Stop::kMaxTokens) std::fprintf(stderr, "[stopped at --max-new-tokens %lld]\n", static_cast<long long>(a.max_new_tokens));
      if (r.stop == Stop::kContextFull) {
        std::fprintf(stderr, "[the conversation filled the context length of %lld tokens]\n",
                     static_cast<long long>(chat.context_length()));
      }
      return r.stop;
    };

    if (from_stdin) {
      reply_to(stdin_user);
      return;
    }
    std::fprintf(stderr, "loom chat: %lld-token context. /exit or Ctrl-D ends the chat; Ctrl-C stops a reply.\n",
                 static_cast<long long>(chat.context_length()));
    std::string line;
    while (true) {
      std::fprintf(stderr, "> ");
      std::fflush(stderr);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line.empty()) continue;
      if (reply_to(line) == loom::generate::ChatSession::Stop::kContextFull) break;
    }
  });
});

}  // namespace
