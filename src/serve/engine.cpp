// The scheduler (engine.h): admission, the step, sampling, stop conditions, block accounting.
#include "serve/engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/parallel.h"
#include "runs/memory.h"
#include "serve/block_pool.h"
#include "serve/stop_text.h"
#include "tokenizer/text_stream.h"

namespace loom::serve {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "?";
}

// ---- the consumer's handle ----------------------------------------------------------------------

Update RequestHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  auto ready = [&] {
    return !pending_.text.empty() || !pending_.tokens.empty() || (finished_ && !finish_taken_);
  };
  cv_.wait_for(lock, timeout, ready);
  Update out = std::move(pending_);
  pending_ = Update{};
  pending_.completion_tokens = out.completion_tokens;
  if (out.finish) finish_taken_ = true;
  return out;
}

void RequestHandle::deliver(std::string text, std::vector<TokenOut> tokens, int64_t completion_tokens,
                            std::optional<FinishReason> finish, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    pending_.text += text;
    for (TokenOut& t : tokens) pending_.tokens.push_back(std::move(t));
    pending_.completion_tokens = completion_tokens;
    if (finish) {
      finished_ = true;
      pending_.finish = finish;
      pending_.error = std::move(error);
    }
  }
  cv_.notify_all();
}

// ---- options ------------------------------------------------------------------------------------

void EngineOptions::validate() const {
  LOOM_CHECK(block_size >= 1 && block_size <= 4096, "serve: the block size must be in [1, 4096], got ", block_size);
  LOOM_CHECK(kv_blocks >= 0 && kv_blocks <= (int64_t{1} << 30), "serve: kv_blocks must be in [0, 2^30], got ", kv_blocks);
  LOOM_CHECK(kv_blocks > 0 || (std::isfinite(kv_memory_bytes) && kv_memory_bytes > 0),
             "serve: the KV cache's memory must be positive, got ", kv_memory_bytes, " bytes");
  LOOM_CHECK(max_running >= 1 && max_running <= 4096, "serve: max_running must be in [1, 4096], got ", max_running);
  LOOM_CHECK(max_queued >= 1 && max_queued <= 1'000'000, "serve: max_queued must be in [1, 1000000], got ", max_queued);
  LOOM_CHECK(max_step_tokens >= max_running && max_step_tokens <= 1'000'000, "serve: max_step_tokens (",
             max_step_tokens, ") must be at least max_running (", max_running, ": one decode row each) and at most 1000000");
  LOOM_CHECK(prefill_chunk >= 1 && prefill_chunk <= max_step_tokens, "serve: prefill_chunk must be in [1, max_step_tokens = ",
             max_step_tokens, "], got ", prefill_chunk);
}

// ---- a running request --------------------------------------------------------------------------

struct Engine::Sequence {
  std::shared_ptr<RequestHandle> handle;
  RequestSpec spec;
  std::vector<int32_t> tokens;  // the prompt, then every token sampled
  int64_t prompt_tokens = 0;
  int64_t computed = 0;   // tokens whose keys and values are in the cache
  int64_t generated = 0;  // tokens sampled
  std::vector<int32_t> table;  // the sequence's blocks, in position order
  int64_t published = 0;       // leading blocks recorded in the prefix cache
  uint64_t chain = 0;          // the chain hash of the last of those
  std::unique_ptr<nn::DecodeCache> cache;  // per-sequence mode
  RngKey key;
  std::unique_ptr<tokenizer::TokenTextStream> text;
  std::unique_ptr<StopText> stop_text;
  Clock::time_point arrival;
  bool first_token = false;
  int64_t admitted = -1;  // admission order (for choosing whom to preempt): newest first
  bool done = false;

  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

namespace {

// log-softmax of the raw logits in double (max-subtracted), and the `top` most likely tokens (ties: lower id).
TokenOut token_out(const float* logits, int64_t V, int32_t token, int64_t top) {
  const double max = *std::max_element(logits, logits + V);
  double total = 0;
  for (int64_t i = 0; i < V; ++i) total += std::exp(static_cast<double>(logits[i]) - max);
  const double lse = max + std::log(total);
  TokenOut out{token, static_cast<float>(logits[token] - lse), {}};
  if (top > 0) {
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min(top, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) {
      out.top.push_back({order[static_cast<size_t>(i)], static_cast<float>(logits[order[static_cast<size_t>(i)]] - lse)});
    }
  }
  return out;
}

}  // namespace

// ---- the engine ---------------------------------------------------------------------------------

Engine::Engine(const models::LanguageModel& model, const tokenizer::Tokenizer& tok, EngineOptions options)
    : model_(model), tok_(tok), options_(options) {
  options_.validate();
  const int64_t S = options_.block_size, ctx = model.context_length();
  double block_bytes;
  if (options_.batched) decoder_ = model.decoder_weights();
  if (decoder_) {
    const nn::DecoderWeights& w = *decoder_;
    block_bytes = static_cast<double>(nn::PagedKVCache::block_bytes(w, S));
    mode_ = "batched";
  } else {
    const double per_token = runs::kv_cache_memory(model.model_config(), 1).total_bytes() / static_cast<double>(ctx);
    block_bytes = per_token * static_cast<double>(S);
    mode_ = options_.batched ? "per-sequence (the " + model.arch() + " model cannot be described as a batched decoder now)"
                             : "per-sequence (batching turned off)";
  }
  int64_t blocks = options_.kv_blocks;
  const int64_t context_blocks = (ctx + S - 1) / S;
  if (blocks == 0) {
    // What the budget holds, but no more than every running sequence at a full context twice over (the
    // rest would only ever hold cached prefixes): a small model does not take the whole budget.
    const double fit = std::floor(options_.kv_memory_bytes / std::max(block_bytes, 1.0));
    blocks = static_cast<int64_t>(std::min(fit, 2.0 * static_cast<double>(options_.max_running * context_blocks)));
  }
  LOOM_CHECK(blocks >= context_blocks, "serve: the KV cache holds ", blocks, " blocks of ", S, " positions (",
             runs::format_bytes(static_cast<double>(blocks) * block_bytes), "), fewer than the ", context_blocks,
             " one full context of ", ctx, " tokens needs (", runs::format_bytes(static_cast<double>(context_blocks) * block_bytes),
             "): give the KV cache more memory");
  pool_ = std::make_unique<BlockPool>(blocks, S);
  if (decoder_) {
    kv_ = std::make_unique<nn::PagedKVCache>(*decoder_, blocks, S);
  }
  counters_.ttft_buckets.assign(std::size(kTtftBounds), 0);
  publish_stats();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { stop(); }

int64_t Engine::blocks_for(int64_t tokens) const {
  const int64_t S = options_.block_size;
  if (!decoder_) return (model_.context_length() + S - 1) / S;
  return (tokens + S - 1) / S;
}

std::shared_ptr<RequestHandle> Engine::submit(RequestSpec spec) {
  const int64_t V = model_.vocab_size(), ctx = model_.context_length(), P = static_cast<int64_t>(spec.prompt.size());
  if (P == 0) throw InvalidRequest("prompt", "the prompt is empty: give at least one token");
  for (int32_t id : spec.prompt) {
    if (id < 0 || id >= V) {
      throw InvalidRequest("prompt", "prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                         std::to_string(V) + ")");
    }
  }
  if (spec.max_tokens < 1) {
    throw InvalidRequest("max_tokens", "max_tokens must be at least 1, got " + std::to_string(spec.max_tokens));
  }
  if (P + spec.max_tokens > ctx) {
    throw InvalidRequest("max_tokens", "this model's maximum context length is " + std::to_string(ctx) +
                                           " tokens, but " + std::to_string(P + spec.max_tokens) + " were requested (" +
                                           std::to_string(P) + " in the prompt, " + std::to_string(spec.max_tokens) +
                                           " in the completion): shorten the prompt or lower max_tokens");
  }
  const generate::SamplingOptions& s = spec.sampling;
  if (!(s.temperature >= 0 && std::isfinite(s.temperature))) {
    throw InvalidRequest("temperature", "temperature must be a finite number >= 0, got " + std::to_string(s.temperature));
  }
  if (s.top_k < 0) throw InvalidRequest("top_k", "top_k must be >= 0, got " + std::to_string(s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    throw InvalidRequest("top_p", "top_p must be in (0, 1], got " + std::to_string(s.top_p));
  }
  if (spec.logprobs < -1 || spec.logprobs > kMaxTopLogprobs) {
    throw InvalidRequest("logprobs", "the number of top logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                                         "], got " + std::to_string(spec.logprobs));
  }
  for (const std::string& stop : spec.stop) {
    if (stop.empty()) throw InvalidRequest("stop", "a stop string is empty");
  }
  for (int32_t id : spec.stop_tokens) {
    if (id < 0 || id >= V) throw InvalidRequest("stop", "stop token " + std::to_string(id) + " is outside the vocabulary");
  }

  auto seq = std::make_unique<Sequence>();
  seq->tokens = spec.prompt;
  seq->prompt_tokens = P;
  seq->key = RngKey::from_seed(spec.seed).fold_in("sample");  // as generate::generate's
  if (spec.sample_index > 0) seq->key = seq->key.fold_in(spec.sample_index);
  seq->text = std::make_unique<tokenizer::TokenTextStream>(tok_);
  seq->stop_text = std::make_unique<StopText>(spec.stop);
  seq->arrival = Clock::now();
  seq->spec = std::move(spec);
  std::lock_guard lock(mutex_);
  if (closed_) throw EngineClosed("the server is shutting down and takes no new requests");
  if (static_cast<int64_t>(incoming_.size()) + stats_.queued >= options_.max_queued) {
    throw EngineBusy("the queue is full (" + std::to_string(options_.max_queued) + " requests wait): retry later");
  }
  seq->handle = std::make_shared<RequestHandle>(next_id_++, P);
  auto handle = seq->handle;
  incoming_.push_back(std::move(seq));
  ++stats_.requests_submitted;
  busy_ = true;
  wake_.notify_all();
  return handle;
}

void Engine::drain() {
  std::unique_lock lock(mutex_);
  closed_ = true;
  idle_.wait(lock, [&] { return (incoming_.empty() && !busy_) || stopping_; });
}

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    closed_ = stopping_ = true;
    wake_.notify_all();
    idle_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Engine::publish_stats() {
  // The recent-throughput window: the last ~10 s of sampled tokens.
  const auto now = Clock::now();
  while (!recent_tokens_.empty() && now - recent_tokens_.front().first > std::chrono::seconds(10)) {
    recent_tokens_sum_ -= recent_tokens_.front().second;
    recent_tokens_.pop_front();
  }
  const int64_t recent = recent_tokens_sum_;
  const double window =
      recent_tokens_.empty() ? 1.0 : std::max(1.0, std::chrono::duration<double>(now - recent_tokens_.front().first).count());
  std::lock_guard lock(mutex_);
  const int64_t submitted = stats_.requests_submitted;
  stats_ = counters_;
  stats_.requests_submitted = submitted;
  stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
  stats_.queued = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.kv_blocks = pool_->num_blocks();
  stats_.kv_blocks_free = pool_->available();
  stats_.kv_blocks_cached = pool_->cached();
  stats_.block_size = pool_->block_size();
  stats_.prefix_lookups = pool_->lookups();
  stats_.prefix_hits = pool_->hits();
  stats_.tokens_per_second = static_cast<double>(recent) / window;
  busy_ = !incoming_.empty() || !waiting_.empty() || !running_.empty();
  if (!busy_) idle_.notify_all();
}

void Engine::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(100),
                     [&] { return stopping_ || !incoming_.empty() || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      stats_.queued = static_cast<int64_t>(waiting_.size());  // submit() bounds incoming + queued
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failure outside a forward pass (one inside is the sequences' own, see step()): end everything.
      for (auto& seq : running_) finish(*seq, FinishReason::Error, e.what());
      for (auto& seq : waiting_) finish(*seq, FinishReason::Error, e.what());
      running_.clear();
      waiting_.clear();
    }
    publish_stats();
  }
  // Stopping: every request still here ends as cancelled.
  std::unique_lock lock(mutex_);
  while (!incoming_.empty()) {
    waiting_.push_back(std::move(incoming_.front()));
    incoming_.pop_front();
  }
  lock.unlock();
  for (auto& seq : running_) finish(*seq, FinishReason::Cancelled);
  for (auto& seq : waiting_) finish(*seq, FinishReason::Cancelled);
  running_.clear();
  waiting_.clear();
  publish_stats();
}

void Engine::release_blocks(Sequence& seq) {
  for (int32_t b : seq.table) pool_->release(b);
  seq.table.clear();
  seq.published = 0;
  seq.chain = 0;
  seq.cache.reset();
}

void Engine::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  if (seq.done) return;
  seq.done = true;
  release_blocks(seq);
  std::string rest;
  if (!seq.stop_text->stopped()) {
    // Text held back (a character split across tokens, bytes after an invalid one) may complete a stop
    // string only now: the text is still cut there, and the reply did stop at it.
    rest = seq.stop_text->push(seq.text->finish());
    if (seq.stop_text->stopped() && reason == FinishReason::Length) reason = FinishReason::Stop;
    rest += seq.stop_text->finish();
  }
  seq.handle->deliver(std::move(rest), {}, seq.generated, reason, error);
  ++counters_.requests_finished;
  ++counters_.finished_by_reason[static_cast<int>(reason)];
}

bool Engine::admit_one(Sequence& seq) {
  const int64_t S = options_.block_size, n = static_cast<int64_t>(seq.tokens.size());
  std::vector<int32_t> hits;
  uint64_t chain = 0;
  int64_t unused_hits = 0;  // hits on blocks no sequence uses: retaining them takes them out of available()
  if (decoder_ && options_.prefix_cache) {
    // Whole blocks of the known tokens but the last (whose logits the step must compute).
    const int64_t full = (n - 1) / S;
    for (int64_t i = 0; i < full; ++i) {
      std::span<const int32_t> block(seq.tokens.data() + i * S, static_cast<size_t>(S));
      const std::optional<int32_t> hit = pool_->lookup(chain, block);
      pool_->count_lookup(hit.has_value());
      if (!hit) break;
      hits.push_back(*hit);
      chain = BlockPool::chain_hash(chain, block);
    }
    for (int32_t b : hits) unused_hits += pool_->unused(b) ? 1 : 0;
  }
  // Then, to the token: a block whose recorded tokens start like the rest of the prompt (but its last
  // token) lends its leading positions, copied into the sequence's own next block.
  std::pair<int32_t, int64_t> donor{-1, 0};
  const int64_t after_hits = static_cast<int64_t>(hits.size()) * S;
  if (decoder_ && options_.prefix_cache && n - 1 > after_hits) {
    const int64_t want = std::min(S, n - 1 - after_hits);
    donor = pool_->longest_start(chain, std::span<const int32_t>(seq.tokens.data() + after_hits, static_cast<size_t>(want)));
    if (donor.second > 0 && pool_->unused(donor.first)) ++unused_hits;  // held during the copy
  }
  const int64_t need = blocks_for(n) - static_cast<int64_t>(hits.size());
  // Room for the prompt, and for each running sequence to grow by a block, before preemption is needed.
  const int64_t headroom = decoder_ ? static_cast<int64_t>(running_.size()) : 0;
  if (pool_->available() - unused_hits < need + headroom) return false;
  for (int32_t b : hits) pool_->retain(b);
  if (donor.second > 0) pool_->retain(donor.first);  // so that the allocations below cannot take it
  seq.table = hits;
  for (int64_t i = 0; i < need; ++i) seq.table.push_back(*pool_->allocate());
  seq.computed = after_hits;
  seq.published = static_cast<int64_t>(hits.size());
  seq.chain = chain;
  if (donor.second > 0) {
    const int32_t own = seq.table[hits.size()];
    kv_->copy_positions(donor.first, own, donor.second);
    pool_->release(donor.first);
    seq.computed += donor.second;
    pool_->record(own, chain, std::span<const int32_t>(seq.tokens.data() + after_hits, static_cast<size_t>(donor.second)));
    ++counters_.prefix_partial_hits;
  }
  counters_.prefix_cached_tokens += seq.computed;
  if (!decoder_) seq.cache = model_.make_decode_cache(1);
  return true;
}

void Engine::admit() {
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    Sequence& seq = *waiting_.front();
    if (!admit_one(seq)) break;  // FIFO: a request never overtakes an earlier one
    if (seq.admitted < 0) counters_.prompt_tokens += seq.prompt_tokens;
    seq.admitted = admissions_++;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Engine::preempt_for(Sequence& needy) {
  // The newest running sequence gives its blocks back and waits at the head of the queue; its tokens are
  // kept, and recomputing them later gives bitwise the same cache (nn/paged_decoder.h).
  auto newest = std::max_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
    return a->done != b->done ? a->done : a->admitted < b->admitted;
  });
  Sequence& victim = **newest;
  (void)needy;
  release_blocks(victim);
  victim.computed = 0;
  ++counters_.preemptions;
  waiting_.push_front(std::move(*newest));
  running_.erase(newest);
}

bool Engine::grow(Sequence& seq) {
  // Blocks for every known token (a decoding sequence's newest token needs its slot).
  while (static_cast<int64_t>(seq.table.size()) < blocks_for(static_cast<int64_t>(seq.tokens.size()))) {
    if (std::optional<int32_t> b = pool_->allocate()) {
      seq.table.push_back(*b);
      continue;
    }
    const bool self = std::none_of(running_.begin(), running_.end(),
                                   [&](const auto& o) { return o.get() != &seq && !o->done && o->admitted > seq.admitted; });
    preempt_for(seq);
    if (self) return false;  // seq was the newest: it was the one preempted
  }
  return true;
}

void Engine::publish_blocks(Sequence& seq) {
  if (!decoder_ || !options_.prefix_cache) return;
  const int64_t S = options_.block_size;
  while (seq.published < seq.computed / S) {
    std::span<const int32_t> block(seq.tokens.data() + seq.published * S, static_cast<size_t>(S));
    pool_->publish(seq.table[static_cast<size_t>(seq.published)], seq.chain, block);
    seq.chain = BlockPool::chain_hash(seq.chain, block);
    ++seq.published;
  }
  // The block being filled: what it holds so far.
  if (const int64_t held = seq.computed - seq.published * S; held > 0) {
    pool_->record(seq.table[static_cast<size_t>(seq.published)], seq.chain,
                  std::span<const int32_t>(seq.tokens.data() + seq.published * S, static_cast<size_t>(held)));
  }
}

void Engine::emit_token(Sequence& seq, const float* logits, int32_t next) {
  const int64_t V = model_.vocab_size();
  ++seq.generated;
  ++counters_.generated_tokens;
  const auto now = Clock::now();
  // One entry a millisecond (a step's tokens share one), not one a token: the window moves by at most that.
  if (!recent_tokens_.empty() && now - recent_tokens_.back().first < std::chrono::milliseconds(1)) {
    ++recent_tokens_.back().second;
  } else {
    recent_tokens_.emplace_back(now, 1);
  }
  ++recent_tokens_sum_;
  if (!seq.first_token) {
    seq.first_token = true;
    const double ttft = std::chrono::duration<double>(now - seq.arrival).count();
    counters_.time_to_first_token_sum += ttft;
    ++counters_.time_to_first_token_count;
    for (size_t i = 0; i < std::size(kTtftBounds); ++i) {
      if (ttft <= kTtftBounds[i]) ++counters_.ttft_buckets[i];
    }
  }
  const bool stop_token =
      std::find(seq.spec.stop_tokens.begin(), seq.spec.stop_tokens.end(), next) != seq.spec.stop_tokens.end();
  std::vector<TokenOut> outs;
  if (!stop_token) {
    outs.push_back(seq.spec.logprobs >= 0 ? token_out(logits, V, next, seq.spec.logprobs) : TokenOut{next, 0, {}});
  }
  std::string text;
  if (!stop_token) text = seq.stop_text->push(seq.text->push(static_cast<tokenizer::TokenId>(next)));
  seq.tokens.push_back(next);
  std::optional<FinishReason> reason;
  if (stop_token || seq.stop_text->stopped()) {
    reason = FinishReason::Stop;
  } else if (seq.generated >= seq.spec.max_tokens || static_cast<int64_t>(seq.tokens.size()) >= model_.context_length()) {
    reason = FinishReason::Length;
  }
  seq.handle->deliver(std::move(text), std::move(outs), seq.generated);
  if (reason) finish(seq, *reason);
}

void Engine::step() {
  // Cancelled and timed-out requests leave first, queued or running.
  const auto now = Clock::now();
  auto drop = [&](Sequence& seq) {
    if (seq.handle->cancelled()) {
      finish(seq, FinishReason::Cancelled);
    } else if (now > seq.spec.deadline) {
      finish(seq, FinishReason::Timeout, "the request ran past its time limit");
    }
    return seq.done;
  };
  std::erase_if(running_, [&](const auto& s) { return drop(*s); });
  std::erase_if(waiting_, [&](const auto& s) { return drop(*s); });
  admit();
  // Blocks for the tokens sampled last step, oldest sequences first (the newest give way).
  std::vector<Sequence*> order;
  for (auto& s : running_) order.push_back(s.get());
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->admitted < b->admitted; });
  for (Sequence* s : order) {
    const bool still_running =
        std::any_of(running_.begin(), running_.end(), [&](const auto& o) { return o.get() == s; });
    if (still_running) grow(*s);
  }
  if (running_.empty()) return;

  // The step: one row for each decoding sequence, then prompt chunks in admission order.
  struct Item {
    Sequence* seq;
    int64_t n;
  };
  std::vector<Item> items;
  int64_t budget = options_.max_step_tokens;
  std::sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return a->admitted < b->admitted; });
  for (auto& s : running_) {
    if (s->remaining() == 1) {
      items.push_back({s.get(), 1});
      --budget;
    }
  }
  for (auto& s : running_) {
    const int64_t r = s->remaining();
    if (r <= 1 || budget <= 0) continue;
    int64_t n = std::min(r, budget);
    if (!decoder_) {
      // Per-sequence mode cuts prompts at fixed positions only: a chunk's arithmetic (the GEMMs' M) must
      // not depend on the rest of the step.
      const int64_t chunk = options_.prefill_chunk;
      n = std::min(r, chunk - s->computed % chunk);
      if (n > budget && !items.empty()) continue;
    }
    items.push_back({s.get(), n});
    budget -= n;
  }
  if (items.empty()) return;

  const int64_t V = model_.vocab_size();
  std::vector<float> logits;  // per-sequence mode: [items wanting logits, V]
  Tensor batched_logits;      // batched mode: [items wanting logits, V], read where it lies
  std::vector<Sequence*> wanting;
  const auto forward_start = Clock::now();
  try {
    if (decoder_) {
      std::vector<nn::DecoderBatchItem> batch;
      for (const Item& it : items) {
        const bool last = it.seq->computed + it.n == static_cast<int64_t>(it.seq->tokens.size());
        batch.push_back({&it.seq->table, it.seq->computed,
                         std::span<const int32_t>(it.seq->tokens.data() + it.seq->computed, static_cast<size_t>(it.n)), last});
        if (last) wanting.push_back(it.seq);
      }
      batched_logits = nn::paged_decoder_forward(*decoder_, *kv_, batch);  // [wanting, V]
    } else {
      for (const Item& it : items) {
        std::vector<int32_t> ids(it.seq->tokens.begin() + it.seq->computed, it.seq->tokens.begin() + it.seq->computed + it.n);
        Tensor out = model_.decode_last(Tensor::from_vector<int32_t>({1, it.n}, ids), *it.seq->cache);  // [1, 1, V]
        if (it.seq->computed + it.n == static_cast<int64_t>(it.seq->tokens.size())) {
          wanting.push_back(it.seq);
          logits.insert(logits.end(), out.data<float>(), out.data<float>() + V);
        }
      }
    }
  } catch (const std::exception& e) {
    for (const Item& it : items) finish(*it.seq, FinishReason::Error, std::string("the forward pass failed: ") + e.what());
    std::erase_if(running_, [](const auto& s) { return s->done; });
    return;
  }
  ++counters_.steps;
  const auto forward_end = Clock::now();
  counters_.forward_seconds += std::chrono::duration<double>(forward_end - forward_start).count();
  for (const Item& it : items) {
    it.seq->computed += it.n;
    counters_.step_rows += it.n;
    publish_blocks(*it.seq);
  }
  const float* rows = wanting.empty() ? nullptr : decoder_ ? batched_logits.data<float>() : logits.data();
  // Each row's token drawn on the step's threads (a pure function of its logits and its own key: which
  // thread draws it changes nothing), then delivered in order on this one.
  // A row whose logits cannot be sampled (not finite) ends its own request, as a failed forward pass
  // does; no exception may leave the threads' region.
  std::vector<int32_t> next(wanting.size());
  std::vector<std::string> failed(wanting.size());
  parallel_for(0, static_cast<int64_t>(wanting.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Sequence& seq = *wanting[static_cast<size_t>(i)];
      try {
        next[static_cast<size_t>(i)] = generate::sample_token(rows + i * V, V, seq.spec.sampling, seq.key,
                                                              static_cast<uint64_t>(seq.generated));
      } catch (const std::exception& e) {
        failed[static_cast<size_t>(i)] = e.what();
      }
    }
  });
  for (size_t i = 0; i < wanting.size(); ++i) {
    if (failed[i].empty()) {
      emit_token(*wanting[i], rows + i * static_cast<size_t>(V), next[i]);
    } else {
      finish(*wanting[i], FinishReason::Error, "sampling failed: " + failed[i]);
    }
  }
  counters_.sample_seconds += std::chrono::duration<double>(Clock::now() - forward_end).count();
  std::erase_if(running_, [](const auto& s) { return s->done; });
}

}  // namespace loom::serve
