// Chat: a conversation with a model, kept in the KV cache, in the ChatML format its chat template was
// recognised as (chat_template.h).
//
// Tokens: the control tokens <|im_start|>/<|im_end|> are added as ids; the text between them (role and
// content, the newline after <|im_end|>) is encoded with no special-token matching, so a user who types
// "<|im_start|>" gets those characters, not a control token. (transformers' apply_chat_template renders a
// string and tokenizes it, which would turn such text into control tokens; loom does not, on purpose.)
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generate/chat_template.h"
#include "generate/generate.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace loom::generate {

// A whole conversation as one prompt, as ChatSession would hold it before a reply: the template's default
// system message when `messages` has none first, each message as <|im_start|>ROLE\nCONTENT<|im_end|>\n
// (text encoded with no special-token matching), then <|im_start|>assistant\n. Throws loom::Error when
// the tokenizer lacks the control tokens or they fall outside `vocab_size`. (The server's chat endpoint.)
struct ChatMlPrompt {
  std::vector<int32_t> ids;
  int32_t im_start = -1, im_end = -1;
};
ChatMlPrompt chatml_prompt(const tokenizer::Tokenizer& tok, const ChatTemplate& tmpl,
                           const std::vector<ChatMessage>& messages, int64_t vocab_size);

// One conversation: each turn prefills only the tokens not yet in the cache (the previous reply's
// end-of-turn token and newline, the user's block, the assistant prefix), then samples the reply.
class ChatSession {
 public:
  // `options.stop_token` is ignored: the reply stops at <|im_end|> or at `eos` (when given).
  ChatSession(const models::LanguageModel& model, const tokenizer::Tokenizer& tok, ChatTemplate tmpl,
              std::optional<std::string> system, GenerateOptions options, std::optional<tokenizer::TokenId> eos);
  ~ChatSession();

  enum class Stop { kEndOfTurn, kMaxTokens, kInterrupted, kContextFull };
  struct Reply {
    std::vector<int32_t> tokens;  // the reply, without the end-of-turn token
    Stop stop;
    // Wall time of the prefill (last_prefill().size() tokens) and of the decode steps (tokens.size()
    // samples, each but the last followed by a one-token forward).
    double prefill_seconds = 0, decode_seconds = 0;
  };
  // Throws loom::Error when the new turn does not fit in what is left of the context. `on_token` sees
  // each reply token as it is sampled (not the end-of-turn token). `interrupt`, when set, stops the reply.
  Reply turn(const std::string& user, const std::function<void(int32_t)>& on_token = nullptr,
             const std::atomic<bool>* interrupt = nullptr);

  // The ids the last turn prefilled, and every id of the conversation so far (prompt and replies).
  const std::vector<int32_t>& last_prefill() const { return last_prefill_; }
  const std::vector<int32_t>& conversation() const { return conversation_; }
  int64_t cached() const;
  int64_t context_length() const { return model_.context_length(); }

 private:
  void feed(const std::vector<int32_t>& ids);
  void append_text(std::vector<int32_t>& out, const std::string& text) const;

  const models::LanguageModel& model_;
  const tokenizer::Tokenizer& tok_;
  GenerateOptions options_;
  int32_t im_start_, im_end_, eos_;
  std::unique_ptr<nn::DecodeCache> cache_;
  std::vector<int32_t> conversation_, last_prefill_;
  std::vector<float> last_logits_;
  uint64_t sampled_ = 0;  // tokens sampled so far (the sampler's counter)
};

}  // namespace loom::generate
