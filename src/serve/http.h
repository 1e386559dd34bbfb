// `loom serve`'s HTTP front: the OpenAI API over the engine (engine.h), a Prometheus /metrics and a chat
// page, on cpp-httplib (Debian's libcpp-httplib-dev: a small, widely used HTTP/1.1 server with a thread
// pool, chunked responses for server-sent events, and limits on bodies, headers and idle connections; a
// blocking thread per connection suits a server whose work is done by one scheduler thread anyway).
//
// Endpoints (docs/serve.md):
//   POST /v1/completions, /v1/chat/completions   whole or streamed (server-sent events, `data: [DONE]`)
//   GET  /v1/models, /health, /metrics, /       (the chat page: chat_page.h)
// Errors are OpenAI's shape {"error": {"message", "type", "param", "code"}} with the HTTP status: 400 a bad
// field (named in `param`), 401 a missing or wrong API key, 404 an unknown model or path, 413 a body past
// the limit, 429 the queue is full and 503 the server is draining (both with Retry-After), 500 a failure.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generate/chat_template.h"
#include "serve/engine.h"
#include "tokenizer/tokenizer.h"

namespace loom::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked
  int port = 8080;                 // 0: any free port (the one bound is printed and in port())
  std::string api_key;             // "": no key; else requests to /v1/* need "Authorization: Bearer KEY"
  std::string model_name = "loom";
  size_t max_body_bytes = 1 << 20;     // a larger body is refused with 413
  int64_t idle_timeout_s = 30;         // a connection that sends nothing for this long is closed
  int64_t request_timeout_s = 600;     // a request still running after this long ends ("timeout")
  int64_t http_threads = 0;            // 0: max_running + max_queued + 4 (a waiting request holds one)
  int64_t retry_after_s = 1;           // the Retry-After of 429 and 503
};

// What the chat endpoint needs to render messages: the model's chat template (nullopt when the model has
// none loom can render, with the reason), and the tokens that end a reply.
struct ChatSetup {
  std::optional<generate::ChatTemplate> chat_template;
  std::string no_template_reason;
  std::vector<int32_t> stop_tokens;  // end of text (eos / <|endoftext|>), for both endpoints
};

class HttpServer {
 public:
  HttpServer(Engine& engine, const tokenizer::Tokenizer& tok, ChatSetup chat, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (throws loom::Error naming the address when it cannot); returns the port bound.
  int bind();
  // Serves until stop(); call bind() first.
  void serve();
  // Refuses new requests with 503 from now on (health too), letting the running ones finish.
  void start_draining() { draining_ = true; }
  // Waits until every completion response begun has been written whole (or its client has gone), at
  // most `timeout`; returns whether they all were. The drain calls it between the engine's last token
  // and stop(): stop() ends the responses still being written, cutting their streams short.
  bool finish_responses(std::chrono::milliseconds timeout);
  // Stops listening and returns once serve() has.
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_ = false;
  int port_ = 0;
};

// The Prometheus text exposition of `stats` (and the HTTP front's own counters), for /metrics.
std::string metrics_text(const EngineStats& stats, int64_t rejected_queue_full, int64_t rejected_draining,
                         int64_t disconnects);

// Whether `given` equals `expected`, in time that depends on neither's contents (SHA-256 of both, every
// byte compared).
bool constant_time_equal(const std::string& given, const std::string& expected);

}  // namespace loom::serve
