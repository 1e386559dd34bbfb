// `loom serve`: an OpenAI-compatible HTTP server over a model (src/serve/: the engine and the HTTP front).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/thread_count.h"
#include "generate/text.h"
#include "quant/qmatmul.h"
#include "runs/load.h"
#include "runs/memory.h"
#include "serve/engine.h"
#include "serve/http.h"

namespace {

struct ServeArgs {
  std::string run, weights, max_memory, kv_memory = "1G", model_name, api_key, chat_template, activations;
  loom::serve::ServerOptions server;
  loom::serve::EngineOptions engine;
  int64_t threads = 0;
  bool f32 = false, no_batching = false, no_prefix_cache = false, check = false;
};

loom::cli::Register reg("serve", "Serve a model over the OpenAI API (continuous batching, a chat page at /)", [](CLI::App& cmd) {
  static ServeArgs a;
  auto* run = loom::cli::in_dir(cmd.add_option("--run", a.run, "run directory (model.safetensors, tokenizer.json)"), "run");
  auto* weights = loom::cli::in_path(
      cmd.add_option("--weights", a.weights, "GGUF file, weights file (a tokenizer.json beside it) or Hugging Face directory"),
      "weights");
  run->excludes(weights);
  cmd.add_option("--host", a.server.host, "address to listen on (default 127.0.0.1: this machine only)");
  loom::cli::in_range(cmd.add_option("--port", a.server.port, "port (default 8080; 0: any free port, printed)"), 0, 65535);
  cmd.add_option("--api-key", a.api_key, "require 'Authorization: Bearer KEY' on /v1/* (default: the LOOM_API_KEY variable, else none)");
  loom::cli::in_file(
      cmd.add_option("--chat-template", a.chat_template, "a file holding the chat template (Jinja, ChatML) to use instead of the model's"),
      "chat template");
  cmd.add_option("--model-name", a.model_name, "the model's id in the API (default: the file or directory name)");
  cmd.add_option("--kv-memory", a.kv_memory, "memory for the KV cache's blocks, e.g. 512M (default 1G)");
  loom::cli::in_range(cmd.add_option("--kv-blocks", a.engine.kv_blocks, "blocks in the KV cache (overrides --kv-memory)"), 0, 1 << 30);
  loom::cli::in_range(cmd.add_option("--block-size", a.engine.block_size, "positions per KV block (default 16)"), 1, 4096);
  loom::cli::in_range(cmd.add_option("--max-running", a.engine.max_running, "most sequences in the running batch (default 64)"), 1, 4096);
  loom::cli::in_range(cmd.add_option("--max-queued", a.engine.max_queued, "most requests waiting; more get 429 (default 256)"), 1, 1000000);
  loom::cli::in_range(cmd.add_option("--max-step-tokens", a.engine.max_step_tokens, "most tokens one forward pass computes (default 256)"), 1, 1000000);
  loom::cli::in_range(cmd.add_option("--request-timeout", a.server.request_timeout_s, "seconds a request may run (default 600)"), 1, 604800);
  loom::cli::in_range(cmd.add_option("--idle-timeout", a.server.idle_timeout_s, "seconds a connection may stay silent (default 30)"), 1, 86400);
  loom::cli::in_range(cmd.add_option("--max-body", a.server.max_body_bytes, "largest request body in bytes (default 1048576)"), 1024, 1 << 30);
  loom::cli::in_range(cmd.add_option("--http-threads", a.server.http_threads, "HTTP worker threads (default max-running + max-queued + 4)"), 0, 100000);
  cmd.add_option("--threads", a.threads, "compute threads (default: every core)");
  cmd.add_flag("--f32", a.f32, "with a GGUF file: multiply by the dequantized weights in f32");
  cmd.add_option("--activations", a.activations,
                 "with weights kept quantized, how activations are rounded: int8x2 (the default) or int8 (llama.cpp's); "
                 "docs/quant.md");
  cmd.add_flag("--no-batching", a.no_batching, "run each sequence on its own (the per-sequence path every family has)");
  cmd.add_flag("--no-prefix-cache", a.no_prefix_cache, "do not reuse the KV blocks of shared prompt prefixes");
  cmd.add_flag("--check", a.check,
               "load the model, size the KV cache and bind the port, say what would be served, and exit (a dry run)");
  cmd.add_option("--max-memory", a.max_memory, "memory the model may use, e.g. 8G (default: MemAvailable)");
  cmd.callback([] {
    LOOM_CHECK(!a.run.empty() || !a.weights.empty(), "serve: give --weights FILE.gguf|DIR or --run DIR");
    // SIGINT and SIGTERM are taken by one thread (sigwait) so that every other thread, started from here
    // on, leaves them blocked: the first drains (running requests finish, new ones get 503), a second stops.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigset_t blocked = stop_signals;
    sigaddset(&blocked, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end of the process
    if (!a.activations.empty()) {
      loom::quant::set_default_activation_rounding(
          loom::quant::activation_rounding_from_name(a.activations, "serve: --activations"));
    }
    if (a.threads > 0) loom::set_num_threads(loom::resolve_thread_count(a.threads, "serve: --threads"));
    if (a.api_key.empty()) {
      if (const char* k = std::getenv("LOOM_API_KEY")) a.api_key = k;
    }
    a.server.api_key = a.api_key;
    a.engine.batched = !a.no_batching;
    a.engine.prefix_cache = !a.no_prefix_cache;
    if (a.engine.kv_blocks == 0) a.engine.kv_memory_bytes = loom::runs::MemoryBudget::parse(a.kv_memory, "--kv-memory").bytes;
    if (a.engine.max_step_tokens < a.engine.max_running) a.engine.max_step_tokens = a.engine.max_running;
    a.engine.prefill_chunk = std::min(a.engine.prefill_chunk, a.engine.max_step_tokens);
    a.engine.validate();

    const auto budget = loom::runs::MemoryBudget::from_setting(a.max_memory);
    const auto job = [](const loom::models::ModelConfig& m) { return loom::runs::generation_memory(m); };
    auto loaded = loom::runs::load_for_job(a.run, a.weights, budget, job, "serve", /*quantized_gguf=*/!a.f32);
    LOOM_CHECK(loaded.tokenizer.has_value(), "serve: no tokenizer found beside the weights");
    const auto& tok = *loaded.tokenizer;
    loom::runs::ChatSettings settings = loom::runs::chat_settings(
        loaded, !a.run.empty() || !std::filesystem::is_directory(a.weights) ? a.run : a.weights);  // an HF directory's tokenizer_config.json
    if (!a.chat_template.empty()) {
      LOOM_CHECK(std::filesystem::is_regular_file(a.chat_template), "serve: --chat-template ", a.chat_template,
                 std::filesystem::exists(a.chat_template) ? " is not a file" : " does not exist");
      std::ifstream in(a.chat_template);
      settings.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      LOOM_CHECK(in.good() || in.eof(), "serve: cannot read --chat-template ", a.chat_template);
    }
    loom::serve::ChatSetup chat;
    if (settings.chat_template.empty()) {
      chat.no_template_reason = "it has none";
    } else {
      try {
        chat.chat_template = loom::generate::ChatTemplate::from_jinja(settings.chat_template);
      } catch (const loom::Error& e) {
        // A template the user gave that cannot be used is an error; the model's own only turns chat off.
        LOOM_CHECK(a.chat_template.empty(), "serve: --chat-template ", a.chat_template, ": ", e.what());
        chat.no_template_reason = e.what();
      }
    }
    const int32_t eos = loom::generate::default_stop_token(tok, settings.eos);
    if (eos >= 0) chat.stop_tokens.push_back(eos);

    std::string name = a.model_name;
    if (name.empty()) {
      std::filesystem::path p(a.run.empty() ? a.weights : a.run);
      if (p.filename().empty()) p = p.parent_path();
      name = p.filename().string();
    }
    a.server.model_name = name;

    const bool chat_on = chat.chat_template.has_value();
    const std::string no_chat = chat.no_template_reason.substr(0, 120);
    loom::serve::Engine engine(*loaded.model, tok, a.engine);
    loom::serve::HttpServer server(engine, tok, std::move(chat), a.server);
    const int port = server.bind();
    const loom::serve::EngineStats s = engine.stats();
    std::printf("loom serve: %s (%s), %lld KV blocks of %lld positions, chat %s\n", name.c_str(), engine.mode().c_str(),
                static_cast<long long>(s.kv_blocks), static_cast<long long>(s.block_size),
                chat_on ? "on" : ("off: " + no_chat).c_str());
    if (a.check) {
      std::printf("check: ok, would listen on http://%s:%d\n", a.server.host.c_str(), port);
      engine.stop();
      return;
    }
    std::printf("listening on http://%s:%d\n", a.server.host.c_str(), port);
    std::fflush(stdout);

    // USR1 wakes a watcher with nothing left to watch.
    sigset_t wake = stop_signals;
    sigaddset(&wake, SIGUSR1);
    std::atomic<bool> signalled = false;
    std::thread watcher([&] {
      int sig = 0;
      sigwait(&wake, &sig);
      if (sig == SIGUSR1) return;
      signalled = true;
      server.start_draining();  // before it says so: a request sent after the message is refused
      std::fprintf(stderr, "loom serve: draining (running requests finish; a second signal stops at once)\n");
      std::thread second([&] {
        int again = 0;
        sigwait(&wake, &again);
        if (again != SIGUSR1) engine.stop();
      });
      engine.drain();
      // The engine's last tokens may still be on their way to the clients: stop() would cut those streams.
      if (!server.finish_responses(std::chrono::seconds(30))) {
        std::fprintf(stderr, "loom serve: responses still being written after 30 s; stopping\n");
      }
      server.stop();
      pthread_kill(second.native_handle(), SIGUSR1);
      second.join();
    });
    server.serve();
    if (!signalled) pthread_kill(watcher.native_handle(), SIGUSR1);
    watcher.join();
    engine.stop();
    std::fprintf(stderr, "loom serve: stopped\n");
  });
});

}  // namespace
