// The serving engine: requests in, tokens out, many requests decoded together (continuous batching).
//
// A scheduler thread owns the model. At every step it
//   * takes in new requests (FIFO) while the KV cache has blocks for their prompts (serve/block_pool.h)
//     and fewer than max_running sequences run, and drops cancelled and timed-out ones, freeing their
//     blocks;
//   * runs one forward pass over every running sequence: one token each for those decoding, and a chunk
//     of the prompt for those still prefilling (at most max_step_tokens rows in all), so a long prompt is
//     spread over several steps instead of stalling the others;
//   * samples each sequence's next token (generate/sampler.h, keyed by the request's seed and the token's
//     index, as `loom generate` does), with its logprobs when asked, and ends the sequences that hit a
//     stop token, a stop string, max_tokens or the context, returning their blocks.
//
// Two ways to run a step (Engine::mode says which):
//   * batched: a model that describes itself as a decoder (LanguageModel::decoder_weights: Llama, f32 or
//     quantized; GPT-2; DeepSeek-V3, whose blocks hold latents [c | k_rope] instead of keys and values)
//     runs every sequence's rows in one nn::paged_decoder_forward pass (weights read once per step) with
//     its keys and values in the pool's blocks, shared prefixes cached;
//   * per-sequence: a model that cannot be described now (sharded, a LoRA adapter, ...), or
//     --no-batching, runs each sequence through its own decode path (LanguageModel::decode_last) with a
//     cache of its own, one after the other. Each sequence holds blocks for its whole context from the
//     pool, so the budget still bounds memory; no prefix cache.
//
// Batch invariance: a request's tokens and logprobs depend on the request alone (its prompt, sampling
// options and seed), never on what else runs, when it arrived, or in which order. Batched: every row is
// computed by the same arithmetic whatever the batch (nn/paged_decoder.h), and prefix-cache hits are
// bitwise what recomputation would give. Per-sequence: each sequence is its own computation, its prompt
// cut into chunks at fixed positions (multiples of prefill_chunk), never by what else is in the step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "generate/sampler.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace loom::serve {

using Clock = std::chrono::steady_clock;

// The most alternatives a token's logprobs list (OpenAI's limit for top_logprobs).
inline constexpr int64_t kMaxTopLogprobs = 20;

enum class FinishReason { Stop, Length, Cancelled, Timeout, Error };
// "stop", "length", "cancelled", "timeout", "error".
const char* finish_reason_name(FinishReason reason);

struct TopLogprob {
  int32_t token;
  float logprob;
};

// A sampled token, with its log-probability under the model (log-softmax of the raw logits, before
// temperature, top-k or top-p) and the most likely alternatives, when the request asked for them.
struct TokenOut {
  int32_t token;
  float logprob = 0;
  std::vector<TopLogprob> top;
};

// A request, tokenized. Engine::submit checks it (errors name the field).
struct RequestSpec {
  std::vector<int32_t> prompt;
  generate::SamplingOptions sampling;
  uint64_t seed = 0;
  // Which of the request's samples this is (OpenAI's `n`): sample i draws with the seed's key folded
  // with i, so the n samples differ and each is reproducible alone. Sample 0 draws as `loom generate`.
  uint64_t sample_index = 0;
  int64_t max_tokens = 16;              // >= 1; prompt + max_tokens <= the context length
  std::vector<std::string> stop;        // the text ends before the first of these (not shown)
  std::vector<int32_t> stop_tokens;     // sampling one ends the text (the token is not shown)
  int64_t logprobs = -1;                // -1: none; 0..kMaxTopLogprobs: the token's and that many alternatives
  Clock::time_point deadline = Clock::time_point::max();
};

// What a request has produced since the consumer last asked: text, tokens, and the end.
struct Update {
  std::string text;              // new text (held back while it may be a stop string's start)
  std::vector<TokenOut> tokens;  // tokens sampled since (those of a stop string included, a stop token not)
  std::optional<FinishReason> finish;
  std::string error;             // the reason, when finish is Error
  int64_t completion_tokens = 0;  // tokens sampled so far in all
};

// The consumer's side of a request; the engine holds the other. Thread-safe.
class RequestHandle {
 public:
  RequestHandle(int64_t id, int64_t prompt_tokens) : id_(id), prompt_tokens_(prompt_tokens) {}
  int64_t id() const { return id_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  // Waits up to `timeout` for something new; returns what there is (possibly nothing).
  Update wait(std::chrono::milliseconds timeout);
  // Asks the engine to stop the request and free its blocks (at its next step).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The engine's side.
  void deliver(std::string text, std::vector<TokenOut> tokens, int64_t completion_tokens,
               std::optional<FinishReason> finish = std::nullopt, std::string error = "");

 private:
  const int64_t id_, prompt_tokens_;
  std::atomic<bool> cancelled_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  Update pending_;
  bool finished_ = false, finish_taken_ = false;
};

struct EngineOptions {
  int64_t block_size = 16;         // positions per KV block
  int64_t kv_blocks = 0;           // blocks in the pool; 0: as many as kv_memory_bytes holds, at most
                                   // 2 * max_running full contexts
  double kv_memory_bytes = 1024.0 * 1024 * 1024;  // the KV cache's budget when kv_blocks is 0
  int64_t max_running = 64;        // sequences in the running batch
  int64_t max_queued = 256;        // requests waiting for room; more are refused (EngineBusy)
  int64_t max_step_tokens = 256;   // rows of one forward pass (decode tokens + prompt chunks)
  int64_t prefill_chunk = 64;      // per-sequence mode: prompts are cut at multiples of this
  bool batched = true;             // false: per-sequence mode even for a model that could batch
  bool prefix_cache = true;        // batched mode: reuse the blocks of a shared prompt prefix
  void validate() const;
};

// A request the engine refuses, naming the field (OpenAI's `param`: "max_tokens", "prompt", ...).
class InvalidRequest : public Error {
 public:
  InvalidRequest(std::string param, const std::string& message) : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// Refusals the HTTP front maps to statuses: the queue is full (429), the engine is shutting down (503).
class EngineBusy : public Error {
 public:
  using Error::Error;
};
class EngineClosed : public Error {
 public:
  using Error::Error;
};

// A snapshot for /metrics and the tests.
struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks = 0, kv_blocks_free = 0, kv_blocks_cached = 0, block_size = 0;
  int64_t prefix_lookups = 0, prefix_hits = 0;
  int64_t prefix_partial_hits = 0;  // prompts that took positions of a block to the token (BlockPool::longest_start)
  int64_t requests_submitted = 0, requests_finished = 0;
  int64_t finished_by_reason[5] = {};  // indexed by FinishReason
  int64_t prompt_tokens = 0, prefix_cached_tokens = 0, generated_tokens = 0;
  int64_t steps = 0, step_rows = 0, preemptions = 0;
  // Seconds the scheduler spent in forward passes, and in sampling and delivering their tokens: with the
  // wall time they say whether a step's arithmetic or what surrounds it (HTTP, scheduling) bounds a load.
  double forward_seconds = 0, sample_seconds = 0;
  int64_t queued = 0;  // requests in the queue (waiting, not yet running): what max_queued bounds
  double time_to_first_token_sum = 0;  // seconds, over the requests that produced a token
  int64_t time_to_first_token_count = 0;
  std::vector<int64_t> ttft_buckets;  // cumulative counts per bound of kTtftBounds
  double tokens_per_second = 0;       // sampled tokens over the last ~10 s
};
inline constexpr double kTtftBounds[] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

class Engine {
 public:
  // The model and tokenizer must outlive the engine. Starts the scheduler thread.
  Engine(const models::LanguageModel& model, const tokenizer::Tokenizer& tok, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws InvalidRequest naming the field for a bad request, EngineBusy when max_queued
  // requests already wait, EngineClosed once drain() or stop() was called.
  std::shared_ptr<RequestHandle> submit(RequestSpec spec);
  // Refuses new requests and returns once every queued and running request has finished.
  void drain();
  // Cancels everything and stops the scheduler (the destructor calls it).
  void stop();

  EngineStats stats() const;
  // "batched" or "per-sequence", and why per-sequence when the model could not batch.
  const std::string& mode() const { return mode_; }
  bool batched() const { return decoder_.has_value(); }
  // Blocks a sequence of `tokens` positions holds (per-sequence mode: a whole context, whatever its length).
  int64_t blocks_for(int64_t tokens) const;
  const EngineOptions& options() const { return options_; }
  int64_t context_length() const { return model_.context_length(); }
  int64_t vocab_size() const { return model_.vocab_size(); }

 private:
  struct Sequence;
  void run();
  void step();
  void admit();
  bool admit_one(Sequence& seq);
  bool grow(Sequence& seq);
  void finish(Sequence& seq, FinishReason reason, const std::string& error = "");
  void release_blocks(Sequence& seq);
  void preempt_for(Sequence& seq);
  // Publishes a sequence's new full blocks to the prefix cache and records what its last block holds.
  void publish_blocks(Sequence& seq);
  void emit_token(Sequence& seq, const float* logits, int32_t next);  // token `next` drawn from `logits`
  void publish_stats();

  const models::LanguageModel& model_;
  const tokenizer::Tokenizer& tok_;
  EngineOptions options_;
  std::string mode_;
  std::optional<nn::DecoderWeights> decoder_;
  std::unique_ptr<nn::PagedKVCache> kv_;
  std::unique_ptr<class BlockPool> pool_;

  mutable std::mutex mutex_;          // guards incoming_, stats_, the flags
  std::condition_variable wake_, idle_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  bool closed_ = false, stopping_ = false, busy_ = false;
  EngineStats stats_;
  int64_t next_id_ = 1;

  // The scheduler thread's own.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  EngineStats counters_;
  int64_t admissions_ = 0;
  std::deque<std::pair<Clock::time_point, int64_t>> recent_tokens_;
  int64_t recent_tokens_sum_ = 0;  // the tokens in recent_tokens_, kept as they come and go (a step summed
                                   // the window's entries before: at 24k tokens/s, 1.6% of the server's CPU)
  std::thread thread_;
};

}  // namespace loom::serve
