// The OpenAI API over the engine (http.h): parsing and checking request bodies, rendering prompts,
// streaming choices as server-sent events, the error shape, the metrics.
#include "serve/http.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "generate/chat.h"
#include "generate/text.h"
#include "io/json.h"
#include "serve/chat_page.h"
#include "tokenizer/sha256.h"

namespace loom::serve {

using json = nlohmann::json;

bool constant_time_equal(const std::string& given, const std::string& expected) {
  // Comparing digests makes the time independent of the lengths too (a plain loop would stop early on a
  // length mismatch, or take time proportional to the secret's length).
  const std::string a = tokenizer::sha256_hex(given), b = tokenizer::sha256_hex(expected);
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0 && a.size() == b.size();
}

std::string metrics_text(const EngineStats& s, int64_t rejected_queue_full, int64_t rejected_draining,
                         int64_t disconnects) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
  };
  metric("loom_requests_submitted_total", "counter", "Requests the engine accepted.", s.requests_submitted);
  o << "# HELP loom_requests_finished_total Requests ended, by reason.\n# TYPE loom_requests_finished_total counter\n";
  for (int r = 0; r < 5; ++r) {
    o << "loom_requests_finished_total{reason=\"" << finish_reason_name(static_cast<FinishReason>(r)) << "\"} "
      << s.finished_by_reason[r] << '\n';
  }
  o << "# HELP loom_requests_rejected_total Requests refused before reaching the engine.\n"
       "# TYPE loom_requests_rejected_total counter\n"
    << "loom_requests_rejected_total{reason=\"queue_full\"} " << rejected_queue_full << '\n'
    << "loom_requests_rejected_total{reason=\"draining\"} " << rejected_draining << '\n';
  metric("loom_client_disconnects_total", "counter", "Requests cancelled because their client went away.", disconnects);
  metric("loom_queue_length", "gauge", "Requests waiting for room in the running batch.", s.waiting);
  metric("loom_running_requests", "gauge", "Sequences in the running batch.", s.running);
  metric("loom_prompt_tokens_total", "counter", "Prompt tokens admitted.", s.prompt_tokens);
  metric("loom_prompt_tokens_cached_total", "counter", "Prompt tokens served by the prefix cache.", s.prefix_cached_tokens);
  metric("loom_generation_tokens_total", "counter", "Tokens sampled.", s.generated_tokens);
  metric("loom_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 s.", s.tokens_per_second);
  metric("loom_steps_total", "counter", "Forward passes of the running batch.", s.steps);
  metric("loom_step_rows_total", "counter", "Rows (tokens) computed over all forward passes.", s.step_rows);
  metric("loom_forward_seconds_total", "counter", "Seconds spent in forward passes.", s.forward_seconds);
  metric("loom_sample_seconds_total", "counter", "Seconds spent sampling and delivering the passes' tokens.", s.sample_seconds);
  metric("loom_preemptions_total", "counter", "Sequences that gave back their blocks to be recomputed later.", s.preemptions);
  metric("loom_kv_blocks", "gauge", "Blocks in the KV cache.", s.kv_blocks);
  metric("loom_kv_blocks_free", "gauge", "Blocks no running sequence holds (cached prefixes included).", s.kv_blocks_free);
  metric("loom_kv_blocks_cached", "gauge", "Free blocks that still hold a cached prompt prefix.", s.kv_blocks_cached);
  metric("loom_kv_block_size", "gauge", "Positions per KV block.", s.block_size);
  metric("loom_prefix_cache_lookups_total", "counter", "Prompt blocks looked up in the prefix cache.", s.prefix_lookups);
  metric("loom_prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix cache.", s.prefix_hits);
  metric("loom_prefix_cache_partial_hits_total", "counter",
         "Prompts that took the leading positions of a block from the prefix cache, to the token.", s.prefix_partial_hits);
  o << "# HELP loom_time_to_first_token_seconds From a request's arrival to its first token.\n"
       "# TYPE loom_time_to_first_token_seconds histogram\n";
  for (size_t i = 0; i < std::size(kTtftBounds); ++i) {
    o << "loom_time_to_first_token_seconds_bucket{le=\"" << kTtftBounds[i] << "\"} "
      << (i < s.ttft_buckets.size() ? s.ttft_buckets[i] : 0) << '\n';
  }
  o << "loom_time_to_first_token_seconds_bucket{le=\"+Inf\"} " << s.time_to_first_token_count << '\n'
    << "loom_time_to_first_token_seconds_sum " << s.time_to_first_token_sum << '\n'
    << "loom_time_to_first_token_seconds_count " << s.time_to_first_token_count << '\n';
  return o.str();
}

namespace {

// ---- errors ----------------------------------------------------------------------------------------

struct HttpError {
  int status;
  std::string message, type, param, code;
};

HttpError bad_request(const std::string& param, const std::string& message) {
  return {400, message, "invalid_request_error", param, ""};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_json(const HttpError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

void send_error(httplib::Response& res, const HttpError& e, int64_t retry_after = 0) {
  res.status = e.status;
  if (retry_after > 0) res.set_header("Retry-After", std::to_string(retry_after));
  res.set_content(dump(error_json(e)), "application/json");
}

// ---- request fields ----------------------------------------------------------------------------------

bool has(const json& body, const char* key) { return body.contains(key) && !body.at(key).is_null(); }

int64_t get_int(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!has(body, key)) return fallback;
  const json& v = body.at(key);
  if (!v.is_number_integer()) throw bad_request(key, std::string(key) + " must be an integer, got " + io::brief_json(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw bad_request(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + io::brief_json(v));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    throw bad_request(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + io::brief_json(v));
  }
  return x;
}

double get_number(const json& body, const char* key, double fallback, double lo, double hi) {
  if (!has(body, key)) return fallback;
  const json& v = body.at(key);
  if (!v.is_number()) throw bad_request(key, std::string(key) + " must be a number, got " + io::brief_json(v));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    std::ostringstream m;
    m << key << " must be in [" << lo << ", " << hi << "], got " << io::brief_json(v);
    throw bad_request(key, m.str());
  }
  return x;
}

bool get_bool(const json& body, const char* key, bool fallback) {
  if (!has(body, key)) return fallback;
  if (!body.at(key).is_boolean()) throw bad_request(key, std::string(key) + " must be true or false, got " + io::brief_json(body.at(key)));
  return body.at(key).get<bool>();
}

// OpenAI's `stop`: a string or up to 4 strings.
std::vector<std::string> get_stop(const json& body) {
  if (!has(body, "stop")) return {};
  const json& v = body.at("stop");
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && v.size() <= 4) {
    for (const json& s : v) {
      if (!s.is_string()) throw bad_request("stop", "stop must be a string or an array of up to 4 strings, got " + io::brief_json(v));
      out.push_back(s.get<std::string>());
    }
  } else {
    throw bad_request("stop", "stop must be a string or an array of up to 4 strings, got " + io::brief_json(v));
  }
  for (const std::string& s : out) {
    if (s.empty()) throw bad_request("stop", "a stop string is empty");
    if (s.size() > 256) throw bad_request("stop", "a stop string is longer than 256 bytes");
  }
  return out;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m.at("content").is_null()) return "";
  const json& c = m.at("content");
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (const json& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part.at("text").is_string()) {
        throw bad_request("messages", where + ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported, got " +
                                          io::brief_json(part));
      }
      out += part.at("text").get<std::string>();
    }
    return out;
  }
  throw bad_request("messages", where + " must be a string or an array of text parts, got " + io::brief_json(c));
}

// ---- a request in flight -------------------------------------------------------------------------------

struct Choice {
  std::shared_ptr<RequestHandle> handle;
  std::string text;
  std::vector<TokenOut> tokens;
  std::optional<FinishReason> finish;
  std::string error;
  int64_t completion_tokens = 0;
  size_t text_sent = 0, tokens_sent = 0;
  bool finish_sent = false;
};

struct Job {
  bool chat = false, stream = false, include_usage = false;
  int64_t logprobs = -1;  // -1 none; else the number of alternatives
  int64_t prompt_tokens = 0;
  std::string id, model;
  int64_t created = 0;
  std::vector<Choice> choices;

  bool done() const {
    return std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.finish.has_value(); });
  }
  bool started() const {
    return std::any_of(choices.begin(), choices.end(),
                       [](const Choice& c) { return !c.tokens.empty() || !c.text.empty() || c.finish.has_value(); });
  }
  // Waits up to `timeout` for news of any choice, and takes it in.
  void poll(std::chrono::milliseconds timeout) {
    const auto each = choices.size() == 1 ? timeout : std::chrono::milliseconds(std::max<int64_t>(1, timeout.count() / static_cast<int64_t>(choices.size())));
    for (Choice& c : choices) {
      if (c.finish) continue;
      Update u = c.handle->wait(each);
      c.text += u.text;
      for (TokenOut& t : u.tokens) c.tokens.push_back(std::move(t));
      c.completion_tokens = u.completion_tokens;
      if (u.finish) {
        c.finish = u.finish;
        c.error = u.error;
      }
    }
  }
  void cancel() {
    for (Choice& c : choices) c.handle->cancel();
  }
  int64_t completion_tokens() const {
    int64_t n = 0;
    for (const Choice& c : choices) n += c.completion_tokens;
    return n;
  }
  json usage() const {
    return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens()},
            {"total_tokens", prompt_tokens + completion_tokens()}};
  }
};

json finish_json(const Choice& c) {
  if (!c.finish) return nullptr;
  switch (*c.finish) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    default: return finish_reason_name(*c.finish);
  }
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
  return b;
}

// Logprobs of tokens [from, to) of a choice, in the endpoint's shape.
json logprobs_json(const Job& job, const Choice& c, size_t from, size_t to, const tokenizer::Tokenizer& tok,
                   int64_t text_offset) {
  if (job.logprobs < 0) return nullptr;
  if (job.chat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const TokenOut& t = c.tokens[i];
      const std::string s = tok.token_bytes(t.token);
      json top = json::array();
      for (const TopLogprob& a : t.top) {
        const std::string as = tok.token_bytes(a.token);
        top.push_back({{"token", as}, {"logprob", a.logprob}, {"bytes", bytes_of(as)}});
      }
      content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = from; i < to; ++i) {
    const TokenOut& t = c.tokens[i];
    const std::string s = tok.token_bytes(t.token);
    tokens.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const TopLogprob& a : t.top) top[tok.token_bytes(a.token)] = a.logprob;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(s.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json whole_response(const Job& job, const tokenizer::Tokenizer& tok) {
  json choices = json::array();
  for (size_t i = 0; i < job.choices.size(); ++i) {
    const Choice& c = job.choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_json(c)},
                   {"logprobs", logprobs_json(job, c, 0, c.tokens.size(), tok, 0)}};
    if (job.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choices.push_back(choice);
  }
  return {{"id", job.id},           {"object", job.chat ? "chat.completion" : "text_completion"},
          {"created", job.created}, {"model", job.model},
          {"choices", choices},     {"usage", job.usage()}};
}

// The server-sent events for what is new in the job since the last call.
std::string stream_events(Job& job, const tokenizer::Tokenizer& tok) {
  std::string out;
  auto event = [&](json choice) {
    json chunk = {{"id", job.id}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", job.created}, {"model", job.model}, {"choices", json::array({choice})}};
    out += "data: " + dump(chunk) + "\n\n";
  };
  for (size_t i = 0; i < job.choices.size(); ++i) {
    Choice& c = job.choices[i];
    const bool news = c.text.size() > c.text_sent || c.tokens.size() > c.tokens_sent;
    const bool first = job.chat && c.text_sent == 0 && c.tokens_sent == 0 && !c.finish_sent;
    if (news || first) {
      json choice = {{"index", i}, {"finish_reason", nullptr},
                     {"logprobs", logprobs_json(job, c, c.tokens_sent, c.tokens.size(), tok, static_cast<int64_t>(c.text_sent))}};
      const std::string piece = c.text.substr(c.text_sent);
      if (job.chat) {
        choice["delta"] = first ? json{{"role", "assistant"}, {"content", piece}} : json{{"content", piece}};
      } else {
        choice["text"] = piece;
      }
      event(choice);
      c.text_sent = c.text.size();
      c.tokens_sent = c.tokens.size();
    }
    if (c.finish && !c.finish_sent) {
      json choice = {{"index", i}, {"finish_reason", finish_json(c)}, {"logprobs", nullptr}};
      if (job.chat) {
        choice["delta"] = json::object();
      } else {
        choice["text"] = "";
      }
      event(choice);
      c.finish_sent = true;
    }
  }
  return out;
}

}  // namespace

// ---- the server ----------------------------------------------------------------------------------------

struct HttpServer::Impl {
  Engine& engine;
  const tokenizer::Tokenizer& tok;
  ChatSetup chat;
  ServerOptions options;
  httplib::Server server;
  std::atomic<int64_t> next_id{1}, rejected_queue_full{0}, rejected_draining{0}, disconnects{0};
  std::atomic<bool>* draining = nullptr;
  socket_t listen_socket = INVALID_SOCKET;  // the last socket the options callback saw: the bound one
  // Completion responses begun and not yet written whole (or dropped): the drain waits for them.
  std::mutex responses_mutex;
  std::condition_variable responses_done;
  int64_t responses = 0;
  // Counts a response from its request's start until the last copy (the handler's, its content
  // provider's) goes: when the body is written, the client gone, or the request refused.
  struct InFlight {
    Impl* impl;
    explicit InFlight(Impl* i) : impl(i) {
      std::lock_guard lock(impl->responses_mutex);
      ++impl->responses;
    }
    ~InFlight() {
      {
        std::lock_guard lock(impl->responses_mutex);
        --impl->responses;
      }
      impl->responses_done.notify_all();
    }
  };

  Impl(Engine& e, const tokenizer::Tokenizer& t, ChatSetup c, ServerOptions o)
      : engine(e), tok(t), chat(std::move(c)), options(std::move(o)) {}

  // The request body as a Job, its choices submitted to the engine.
  Job start(const httplib::Request& req, bool chat_endpoint) {
    json body;
    try {
      // Depth-checked before parsing: copying, comparing and dumping a value recurse once per level, so a
      // body nested 400,000 deep would overflow the stack (io/json.h).
      body = io::parse_json(req.body, "the request body", io::JsonLimits{64, options.max_body_bytes});
    } catch (const Error& e) {
      throw bad_request("", e.what());
    }
    if (!body.is_object()) throw bad_request("", "the body must be a JSON object, got " + io::brief_json(body));
    Job job;
    job.chat = chat_endpoint;
    job.model = options.model_name;
    if (has(body, "model")) {
      if (!body.at("model").is_string()) throw bad_request("model", "model must be a string, got " + io::brief_json(body.at("model")));
      const std::string m = body.at("model").get<std::string>();
      if (m != options.model_name) {
        throw HttpError{404, "the model '" + m + "' does not exist: this server serves '" + options.model_name + "'",
                        "invalid_request_error", "model", "model_not_found"};
      }
    }
    // Unsupported knobs are refused rather than silently ignored.
    for (const char* key : {"presence_penalty", "frequency_penalty"}) {
      if (has(body, key) && get_number(body, key, 0, -2, 2) != 0) {
        throw bad_request(key, std::string(key) + " is not supported by loom serve (only 0)");
      }
    }
    if (has(body, "logit_bias") && !(body.at("logit_bias").is_object() && body.at("logit_bias").empty())) {
      throw bad_request("logit_bias", "logit_bias is not supported by loom serve");
    }
    if (!chat_endpoint && get_bool(body, "echo", false)) throw bad_request("echo", "echo is not supported by loom serve");
    if (has(body, "tools") || has(body, "functions")) {
      throw bad_request(has(body, "tools") ? "tools" : "functions", "tools and function calling are not supported by loom serve");
    }

    // The prompt.
    const int64_t ctx = engine.context_length(), V = engine.vocab_size();
    std::vector<int32_t> prompt;
    std::vector<int32_t> stop_tokens = chat.stop_tokens;
    const char* prompt_field = chat_endpoint ? "messages" : "prompt";
    if (chat_endpoint) {
      if (!has(body, "messages") || !body.at("messages").is_array() || body.at("messages").empty()) {
        throw bad_request("messages", "messages must be a non-empty array of {\"role\", \"content\"} objects");
      }
      if (!chat.chat_template) {
        throw bad_request("messages", "this model has no chat template loom can render (" + chat.no_template_reason +
                                          "): use /v1/completions with a prompt");
      }
      std::vector<generate::ChatMessage> messages;
      const json& ms = body.at("messages");
      for (size_t i = 0; i < ms.size(); ++i) {
        const json& m = ms[i];
        if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
          throw bad_request("messages", "messages[" + std::to_string(i) + "] must be an object with a string role");
        }
        const std::string role = m.at("role").get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
          throw bad_request("messages", "messages[" + std::to_string(i) + "].role must be system, developer, user or assistant, got '" +
                                            role.substr(0, 50) + "'");
        }
        messages.push_back({role == "developer" ? "system" : role, message_content(m, i)});
      }
      const generate::ChatMlPrompt p = generate::chatml_prompt(tok, *chat.chat_template, messages, V);
      prompt = p.ids;
      stop_tokens.push_back(p.im_end);
    } else {
      if (!has(body, "prompt")) throw bad_request("prompt", "prompt is required");
      const json& p = body.at("prompt");
      const json* one = &p;
      if (p.is_array() && p.size() == 1 && p[0].is_string()) one = &p[0];
      if (one->is_string()) {
        prompt = generate::prompt_ids(tok, one->get<std::string>());
      } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
        for (const json& x : p) {
          const int64_t id = x.get<int64_t>();
          if (id < 0 || id >= V) {
            throw bad_request("prompt", "prompt token " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
          }
          prompt.push_back(static_cast<int32_t>(id));
        }
      } else {
        throw bad_request("prompt", "prompt must be a string, an array of one string, or an array of token ids");
      }
    }
    const int64_t P = static_cast<int64_t>(prompt.size());
    if (P == 0) throw bad_request(prompt_field, std::string(prompt_field) + " encodes to no tokens: give some text");
    if (P >= ctx) {
      throw bad_request(prompt_field, "the prompt is " + std::to_string(P) + " tokens, but this model's maximum context length is " +
                                          std::to_string(ctx) + " tokens (the prompt and the completion together)");
    }
    job.prompt_tokens = P;

    // The sampling and the limits.
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.stop_tokens = stop_tokens;
    spec.stop = get_stop(body);
    spec.sampling.temperature = static_cast<float>(get_number(body, "temperature", 1.0, 0.0, 2.0));
    spec.sampling.top_p = static_cast<float>(get_number(body, "top_p", 1.0, 0.0, 1.0));
    if (spec.sampling.top_p <= 0) throw bad_request("top_p", "top_p must be in (0, 1], got 0");
    spec.sampling.top_k = get_int(body, "top_k", 0, -1, V);
    if (spec.sampling.top_k < 0) spec.sampling.top_k = 0;  // -1: no limit, as vLLM
    const char* max_field = chat_endpoint && has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    const int64_t room = ctx - P;
    const int64_t max_tokens = get_int(body, max_field, chat_endpoint ? room : std::min<int64_t>(16, room), 1, 1'000'000);
    if (max_tokens > room) {
      throw bad_request(max_field, "this model's maximum context length is " + std::to_string(ctx) + " tokens, but " +
                                       std::to_string(P + max_tokens) + " were requested (" + std::to_string(P) +
                                       " in the prompt, " + std::to_string(max_tokens) + " in the completion): lower " +
                                       max_field + " or shorten the prompt");
    }
    spec.max_tokens = max_tokens;
    const int64_t n = get_int(body, "n", 1, 1, 16);
    if (has(body, "seed")) {
      const json& s = body.at("seed");
      if (!s.is_number_integer()) throw bad_request("seed", "seed must be an integer, got " + io::brief_json(s));
      spec.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
    } else {
      static std::mutex m;
      static std::mt19937_64 rng(std::random_device{}());
      std::lock_guard lock(m);
      spec.seed = rng();
    }
    if (chat_endpoint) {
      if (get_bool(body, "logprobs", false)) job.logprobs = get_int(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
      else if (has(body, "top_logprobs")) throw bad_request("top_logprobs", "top_logprobs needs logprobs: true");
    } else {
      job.logprobs = get_int(body, "logprobs", -1, 0, kMaxTopLogprobs);
      if (!has(body, "logprobs")) job.logprobs = -1;
    }
    spec.logprobs = job.logprobs;
    job.stream = get_bool(body, "stream", false);
    if (has(body, "stream_options")) {
      const json& so = body.at("stream_options");
      if (!so.is_object()) throw bad_request("stream_options", "stream_options must be an object");
      if (!job.stream) throw bad_request("stream_options", "stream_options needs stream: true");
      job.include_usage = get_bool(so, "include_usage", false);
    }
    spec.deadline = Clock::now() + std::chrono::seconds(options.request_timeout_s);

    if (*draining) {
      ++rejected_draining;
      throw HttpError{503, "the server is shutting down", "server_error", "", "draining"};
    }
    job.id = std::string(chat_endpoint ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    job.created = static_cast<int64_t>(std::time(nullptr));
    try {
      for (int64_t i = 0; i < n; ++i) {
        RequestSpec s = spec;
        s.sample_index = static_cast<uint64_t>(i);
        Choice c;
        c.handle = engine.submit(std::move(s));
        job.choices.push_back(std::move(c));
      }
    } catch (const InvalidRequest& e) {
      job.cancel();
      throw bad_request(e.param(), e.what());
    } catch (const EngineBusy& e) {
      job.cancel();
      ++rejected_queue_full;
      throw HttpError{429, e.what(), "rate_limit_error", "", "queue_full"};
    } catch (const EngineClosed& e) {
      job.cancel();
      ++rejected_draining;
      throw HttpError{503, e.what(), "server_error", "", "draining"};
    }
    return job;
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat_endpoint) {
    auto in_flight = std::make_shared<InFlight>(this);
    auto job = std::make_shared<Job>(start(req, chat_endpoint));
    // Until something comes, the status can still say what went wrong.
    while (!job->started()) job->poll(std::chrono::milliseconds(100));
    if (job->done() && std::all_of(job->choices.begin(), job->choices.end(), [](const Choice& c) {
          return c.finish == FinishReason::Error && c.tokens.empty();
        })) {
      throw HttpError{500, "the request failed: " + job->choices[0].error, "server_error", "", ""};
    }
    const tokenizer::Tokenizer& t = tok;
    Impl* self = this;
    if (job->stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [job, &t, self, in_flight](size_t, httplib::DataSink& sink) {
        for (;;) {
          const std::string events = stream_events(*job, t);
          if (!events.empty() && !sink.write(events.data(), events.size())) {
            job->cancel();  // the client went away: free its blocks
            ++self->disconnects;
            return false;
          }
          if (job->done()) break;
          job->poll(std::chrono::milliseconds(100));
        }
        std::string tail;
        if (job->include_usage) {
          json chunk = {{"id", job->id}, {"object", job->chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", job->created}, {"model", job->model}, {"choices", json::array()}, {"usage", job->usage()}};
          tail += "data: " + dump(chunk) + "\n\n";
        }
        tail += "data: [DONE]\n\n";
        sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      });
      return;
    }
    // Whole: the body once every choice has finished. Meanwhile a space every second (JSON allows
    // leading whitespace) finds out whether the client is still there, and cancels the request if not.
    res.set_chunked_content_provider("application/json", [job, &t, self, in_flight](size_t, httplib::DataSink& sink) {
      auto last = Clock::now();
      while (!job->done()) {
        job->poll(std::chrono::milliseconds(100));
        if (Clock::now() - last > std::chrono::seconds(1)) {
          last = Clock::now();
          if (!sink.write(" ", 1)) {
            job->cancel();
            ++self->disconnects;
            return false;
          }
        }
      }
      const std::string body = dump(whole_response(*job, t));
      sink.write(body.data(), body.size());
      sink.done();
      return true;
    });
  }
};

HttpServer::HttpServer(Engine& engine, const tokenizer::Tokenizer& tok, ChatSetup chat, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tok, std::move(chat), std::move(options))) {
  Impl& im = *impl_;
  im.draining = &draining_;
  const ServerOptions& o = im.options;
  LOOM_CHECK(o.port >= 0 && o.port <= 65535, "serve: --port must be in [0, 65535], got ", o.port);
  LOOM_CHECK(o.max_body_bytes >= 1024, "serve: the body limit must be at least 1024 bytes, got ", o.max_body_bytes);
  LOOM_CHECK(o.idle_timeout_s >= 1 && o.request_timeout_s >= 1, "serve: timeouts must be at least 1 s, got idle ",
             o.idle_timeout_s, " and request ", o.request_timeout_s);
  LOOM_CHECK(o.http_threads >= 0 && o.http_threads <= 4096, "serve: --http-threads must be in [0, 4096], got ", o.http_threads);
  const EngineOptions& eo = engine.options();
  const size_t threads = static_cast<size_t>(o.http_threads > 0 ? o.http_threads : eo.max_running + eo.max_queued + 4);
  httplib::Server& s = im.server;
  // cpp-httplib's default socket options add SO_REUSEPORT, with which a second `loom serve` on a port in
  // use binds it too and the kernel splits the clients between the two: keep SO_REUSEADDR only (a restart
  // need not wait for TIME_WAIT), so a busy port is an error naming --port.
  s.set_socket_options([&im](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    im.listen_socket = sock;  // bind() widens its backlog once it listens
  });
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(o.max_body_bytes);
  s.set_read_timeout(static_cast<time_t>(o.idle_timeout_s), 0);
  s.set_write_timeout(static_cast<time_t>(o.idle_timeout_s), 0);
  s.set_keep_alive_timeout(static_cast<time_t>(std::min<int64_t>(o.idle_timeout_s, 5)));
  s.set_tcp_nodelay(true);

  s.set_pre_routing_handler([&im](const httplib::Request& req, httplib::Response& res) {
    if (!im.options.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string bearer = "Bearer ";
      const std::string given = auth.rfind(bearer, 0) == 0 ? auth.substr(bearer.size()) : "";
      if (!constant_time_equal(given, im.options.api_key)) {
        send_error(res, {401, given.empty() ? "no API key given: send the header 'Authorization: Bearer KEY'" : "the API key is wrong",
                         "invalid_request_error", "", "invalid_api_key"});
        res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto guarded = [&im](bool chat_endpoint) {
    return [&im, chat_endpoint](const httplib::Request& req, httplib::Response& res) {
      try {
        im.completions(req, res, chat_endpoint);
      } catch (const HttpError& e) {
        send_error(res, e, e.status == 429 || e.status == 503 ? im.options.retry_after_s : 0);
      } catch (const InvalidRequest& e) {
        send_error(res, bad_request(e.param(), e.what()));
      } catch (const std::exception& e) {
        send_error(res, {500, std::string("the server failed: ") + e.what(), "server_error", "", ""});
      }
    };
  };
  s.Post("/v1/completions", guarded(false));
  s.Post("/v1/chat/completions", guarded(true));
  s.Get("/v1/models", [&im](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", im.options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "loom"},
              {"max_model_len", im.engine.context_length()}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  s.Get("/health", [&im](const httplib::Request&, httplib::Response& res) {
    if (*im.draining) {
      send_error(res, {503, "the server is shutting down", "server_error", "", "draining"}, im.options.retry_after_s);
      return;
    }
    res.set_content(dump({{"status", "ok"}, {"model", im.options.model_name}, {"mode", im.engine.mode()}}), "application/json");
  });
  s.Get("/metrics", [&im](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(im.engine.stats(), im.rejected_queue_full, im.rejected_draining, im.disconnects),
                    "text/plain; version=0.0.4");
  });
  s.Get("/", [&im](const httplib::Request&, httplib::Response& res) {
    res.set_content(chat_page_html(im.options.model_name), "text/html; charset=utf-8");
  });
  // Errors httplib raises itself (no route, a body past the limit, a request it cannot parse) in
  // OpenAI's shape too.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    switch (res.status) {
      case 404: send_error(res, {404, "no such endpoint: " + req.method + " " + req.path.substr(0, 200), "invalid_request_error", "", "not_found"}); break;
      case 413: send_error(res, {413, "the request body is larger than the server's limit", "invalid_request_error", "", "body_too_large"}); break;
      case 405: send_error(res, {405, "method not allowed: " + req.method + " " + req.path.substr(0, 200), "invalid_request_error", "", ""}); break;
      default: send_error(res, {res.status, "the request could not be served (HTTP " + std::to_string(res.status) + ")", "invalid_request_error", "", ""});
    }
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, "the server failed: " + what, "server_error", "", ""});
  });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    port_ = impl_->server.bind_to_any_port(o.host);
    LOOM_CHECK(port_ > 0, "serve: --host ", o.host, ": cannot listen there (on any port; not an address of this machine?)");
  } else {
    LOOM_CHECK(impl_->server.bind_to_port(o.host, o.port), "serve: --host ", o.host, " --port ", o.port,
               ": cannot listen there (the port is in use, or the host is not an address of this machine)");
    port_ = o.port;
  }
  // Debian's cpp-httplib (0.11, a compiled library: its CPPHTTPLIB_LISTEN_BACKLOG cannot be set from here)
  // listens with a backlog of 5. A burst of clients connecting at once overflows it, and the kernel then
  // drops or resets the connections past it (11 of 64 were reset under load). listen() again on the
  // listening socket only changes its backlog: to the system's maximum (net.core.somaxconn caps it).
  LOOM_CHECK(impl_->listen_socket != INVALID_SOCKET && ::listen(impl_->listen_socket, SOMAXCONN) == 0,
             "serve: cannot widen the listen backlog of --host ", o.host, " port ", port_, ": ", std::strerror(errno));
  return port_;
}

void HttpServer::serve() { impl_->server.listen_after_bind(); }

bool HttpServer::finish_responses(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->responses_mutex);
  return impl_->responses_done.wait_for(lock, timeout, [&] { return impl_->responses == 0; });
}

void HttpServer::stop() {
  if (impl_ && impl_->server.is_running()) impl_->server.stop();
}

}  // namespace loom::serve
