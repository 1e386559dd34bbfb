// A model's chat template, recognised as ChatML.
//
// The template (GGUF's tokenizer.chat_template, Hugging Face's tokenizer_config.json "chat_template") is
// Jinja. loom has no Jinja engine: it interprets the small subset ChatML templates are written in (a for
// loop over messages, if/elif/else, string concatenation, message['role'|'content'], loop.first/last,
// messages[i], add_generation_prompt, ==, !=, and/or/not), renders probe conversations with it and
// accepts the template only when every probe is ChatML:
//   [default system block]<|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
// The default system block is what SmolLM2's template inserts when the conversation has no system
// message. Anything else (another format, a construct outside the subset) is refused, naming it.
// The conversation that follows the template is chat.h's.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::generate {

// ChatML's control tokens: a message is kChatMlStart ROLE \n CONTENT kChatMlEnd \n.
inline constexpr const char* kChatMlStart = "<|im_start|>";
inline constexpr const char* kChatMlEnd = "<|im_end|>";

struct ChatMessage {
  std::string role, content;
};

// Renders `messages` with the Jinja subset described above; throws loom::Error naming a construct
// outside it. Exposed for tests.
std::string render_chat_template(const std::string& jinja, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

struct ChatTemplate {
  // The system message the template adds when the conversation has none (SmolLM2's "You are a helpful
  // AI assistant named SmolLM, ..."); nullopt when it adds none.
  std::optional<std::string> default_system;
  // Recognises `jinja` as ChatML by rendering probes; throws loom::Error naming the template otherwise.
  static ChatTemplate from_jinja(const std::string& jinja);
};

}  // namespace loom::generate
