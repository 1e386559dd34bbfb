// A conversation kept in the KV cache (chat.h); the template it follows is chat_template.h's.
#include "generate/chat.h"

#include <chrono>

namespace loom::generate {

ChatSession::ChatSession(const models::LanguageModel& model, const tokenizer::Tokenizer& tok, ChatTemplate tmpl,
                         std::optional<std::string> system, GenerateOptions options,
                         std::optional<tokenizer::TokenId> eos)
    : model_(model), tok_(tok), options_(options) {
  options_.sampling.validate();
  LOOM_CHECK(options_.max_new_tokens >= 0 && options_.max_new_tokens <= kMaxNewTokens,
             "chat: max_new_tokens must be in [0, ", kMaxNewTokens, "], got ", options_.max_new_tokens);
  auto control = [&](const char* text) {
    auto id = tok.special_token_id(text);
    LOOM_CHECK(id.has_value(), "chat: the template is ChatML but the tokenizer has no control token ", text);
    LOOM_CHECK(*id < static_cast<tokenizer::TokenId>(model.vocab_size()), "chat: control token ", text, " (id ", *id,
               ") is outside the model's vocabulary of ", model.vocab_size());
    return static_cast<int32_t>(*id);
  };
  im_start_ = control(kChatMlStart);
  im_end_ = control(kChatMlEnd);
  eos_ = eos ? static_cast<int32_t>(*eos) : -1;
  cache_ = model.make_decode_cache(1);
  if (system || tmpl.default_system) {
    conversation_.push_back(im_start_);
    append_text(conversation_, "system\n" + (system ? *system : *tmpl.default_system));
    conversation_.push_back(im_end_);
    append_text(conversation_, "\n");
  }
}

ChatSession::~ChatSession() = default;

ChatMlPrompt chatml_prompt(const tokenizer::Tokenizer& tok, const ChatTemplate& tmpl,
                           const std::vector<ChatMessage>& messages, int64_t vocab_size) {
  auto control = [&](const char* text) {
    auto id = tok.special_token_id(text);
    LOOM_CHECK(id.has_value(), "chat: the template is ChatML but the tokenizer has no control token ", text);
    LOOM_CHECK(*id < static_cast<tokenizer::TokenId>(vocab_size), "chat: control token ", text, " (id ", *id,
               ") is outside the model's vocabulary of ", vocab_size);
    return static_cast<int32_t>(*id);
  };
  ChatMlPrompt p;
  p.im_start = control(kChatMlStart);
  p.im_end = control(kChatMlEnd);
  auto text = [&](const std::string& t) {
    for (auto id : tok.encode_ordinary(t)) p.ids.push_back(static_cast<int32_t>(id));
  };
  auto message = [&](const std::string& role, const std::string& content) {
    p.ids.push_back(p.im_start);
    text(role + "\n" + content);
    p.ids.push_back(p.im_end);
    text("\n");
  };
  if (tmpl.default_system && (messages.empty() || messages.front().role != "system")) {
    message("system", *tmpl.default_system);
  }
  for (const ChatMessage& m : messages) message(m.role, m.content);
  p.ids.push_back(p.im_start);
  text("assistant\n");
  return p;
}

int64_t ChatSession::cached() const { return cache_->length(); }

void ChatSession::append_text(std::vector<int32_t>& out, const std::string& text) const {
  for (auto id : tok_.encode_ordinary(text)) out.push_back(static_cast<int32_t>(id));
}

void ChatSession::feed(const std::vector<int32_t>& ids) {
  const int64_t t = static_cast<int64_t>(ids.size()), V = model_.vocab_size();
  Tensor logits = model_.decode_last(Tensor::from_vector<int32_t>({1, t}, ids), *cache_);  // [1, 1, V]
  const float* last = logits.data<float>();
  last_logits_.assign(last, last + V);
}

ChatSession::Reply ChatSession::turn(const std::string& user, const std::function<void(int32_t)>& on_token,
                                     const std::atomic<bool>* interrupt) {
  // conversation_ is what the cache holds, then what it does not yet (the system block before the
  // first turn, the previous reply's last token and closing <|im_end|>\n).
  std::vector<int32_t> block = {im_start_};
  append_text(block, "user\n" + user);
  block.push_back(im_end_);
  append_text(block, "\n");
  block.push_back(im_start_);
  append_text(block, "assistant\n");
  const int64_t ctx = model_.context_length(), used = cache_->length();
  const int64_t needed = static_cast<int64_t>(conversation_.size() + block.size()) - used;
  LOOM_CHECK(used + needed < ctx, "chat: the conversation is full: ", used, " tokens are cached and this turn needs ",
             needed, " more, but the context length is ", ctx, " (start a new chat, or say less)");
  conversation_.insert(conversation_.end(), block.begin(), block.end());
  last_prefill_.assign(conversation_.begin() + used, conversation_.end());
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  feed(last_prefill_);
  const auto t1 = Clock::now();

  const RngKey key = RngKey::from_seed(options_.seed).fold_in("sample");
  const int64_t V = model_.vocab_size();
  Reply reply{{}, Stop::kMaxTokens};
  for (int64_t i = 0; i < options_.max_new_tokens; ++i) {
    if (interrupt && interrupt->load()) {
      reply.stop = Stop::kInterrupted;
      break;
    }
    const int32_t next = sample_token(last_logits_.data(), V, options_.sampling, key, sampled_++);
    if (next == im_end_ || next == eos_) {
      reply.stop = Stop::kEndOfTurn;
      break;
    }
    reply.tokens.push_back(next);
    conversation_.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == options_.max_new_tokens) break;
    if (cache_->length() + 1 >= ctx) {  // room for this token and the end-of-turn token after it
      reply.stop = Stop::kContextFull;
      break;
    }
    feed({next});
  }
  reply.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  reply.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  // The template closes every message with <|im_end|>\n, whatever stopped the reply.
  conversation_.push_back(im_end_);
  append_text(conversation_, "\n");
  return reply;
}

}  // namespace loom::generate
