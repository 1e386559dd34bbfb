// Supervised fine-tuning data: JSON Lines of conversations, rendered with the model's chat template,
// with the loss on the assistant's tokens only.
//
// A line is one example, either
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}   (OpenAI's fine-tuning
//                                                                                   format, HF datasets')
//   {"prompt": "...", "completion": "..."}
// Other keys are ignored; blank lines are skipped; anything else (not JSON, a missing or mistyped field, an
// unknown role, no assistant message) is an error naming the file, the line number and the field:
//   train.jsonl:7: messages[2].role must be "system", "user" or "assistant", got "bot"
//
// Rendering (SftFormat):
//   ChatMl  the model's ChatML template (generate/chat_template.h), as loom chat and transformers'
//           apply_chat_template render it: [default system block] then per message
//           <|im_start|>ROLE\nCONTENT<|im_end|>\n, control tokens as ids and the text between them encoded
//           without special-token matching (as chat.h). A prompt/completion line is a user message and the
//           assistant's reply. Trained: each assistant message's CONTENT tokens and its <|im_end|> (so the
//           model learns to stop); not the system/user blocks, nor "<|im_start|>assistant\n".
//   Raw     no template (a base model): prompt/completion lines only, ids = encode(prompt) +
//           encode(completion) + [eos], trained on the completion and eos (TRL's completion-only loss).
// A token that straddles the boundary between a role header and the content (BPE may merge across it)
// counts as the header's, so the trained tokens are exactly those of the joint encoding that lie wholly
// inside the content.
//
// An example becomes inputs = ids[0 .. n-2] and targets[t] = ids[t+1] where ids[t+1] is trained, else
// -100 (ops::cross_entropy's ignore_index): the loss is the mean over the trained tokens only.
//
// Legend: B examples per batch, T the longest example of the batch (<= the context length).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/batch.h"
#include "generate/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace loom::train {

inline constexpr int32_t kIgnoreTarget = -100;

enum class SftFormat { ChatMl, Raw };

// How examples are rendered: the format, its control and end tokens, the template's default system message.
struct SftRenderer {
  SftFormat format = SftFormat::Raw;
  std::optional<std::string> default_system;  // ChatMl: added when a conversation has no system message
  int32_t im_start = -1, im_end = -1;         // ChatMl's control tokens
  int32_t eos = -1;                           // Raw: appended after the completion

  // ChatMl from a chat template (refused, naming it, unless it is ChatML and the tokenizer has its
  // control tokens), or Raw when `chat_template` is empty (then the tokenizer must have an end token:
  // `eos`, else <|endoftext|>).
  static SftRenderer for_model(const tokenizer::Tokenizer& tok, const std::string& chat_template,
                               std::optional<tokenizer::TokenId> eos);
};

struct SftExample {
  int64_t line = 0;             // 1-based line number in its file
  std::vector<int32_t> ids;     // the rendered conversation
  std::vector<uint8_t> trained; // per id: 1 when the loss predicts it
  // Exact match: the conversation up to the last assistant reply's content (its prompt, ending in the
  // assistant header), and that reply's text.
  std::vector<int32_t> prompt;
  std::string reference;

  int64_t trained_tokens() const;
};

// One parsed line, rendered; `where` ("train.jsonl:7") leads its errors.
SftExample render_sft_line(const nlohmann::json& line, const SftRenderer& r, const tokenizer::Tokenizer& tok,
                           const std::string& where);

// Every example of a JSON Lines file. Each must fit `context_length` tokens once shifted (ids.size() - 1
// <= context_length), else an error naming the line and both lengths.
std::vector<SftExample> read_sft_file(const std::string& path, const SftRenderer& r, const tokenizer::Tokenizer& tok,
                                      int64_t context_length);

// A held-out split: every example whose position in a seeded permutation of 0..n-1 falls in the last
// round(fraction * n) (at least one when fraction > 0 and n > 1) goes to `held_out`, the rest stay, each
// side in file order.
struct SftSplit {
  std::vector<SftExample> train, held_out;
};
SftSplit split_sft(std::vector<SftExample> examples, double fraction, RngKey key);

// Examples padded into one batch: inputs padded with `pad` and targets with -100 up to the longest.
data::Batch sft_batch(const std::vector<const SftExample*>& examples, int32_t pad = 0);

// The same examples packed into rows of at most `row_length` positions (data.packing): each example, in
// order, goes into the first row with room for it (first fit), so a batch of short examples becomes one or
// a few rows instead of B rows padded to the longest. Each example keeps its own positions (0, 1, ... in
// batch.positions) and attends only to itself (batch.key_begin: block-diagonal causal attention); its
// targets are its own, so the trained tokens, and the loss as their mean, are those of sft_batch. The
// rows are padded to the longest row (pad, target -100, a document of their own). Every example must fit
// row_length (read_sft_file checked it against the context length).
data::Batch sft_packed_batch(const std::vector<const SftExample*>& examples, int64_t row_length, int32_t pad = 0);

// Batches of B examples, epoch after epoch, each epoch in its own seeded order (key.fold_in(epoch)); the
// last batch of an epoch may be short. The state is (epoch, position), so a resume continues exactly.
// pack_length > 0: each batch's examples are packed into rows of that many positions (sft_packed_batch);
// the examples of a step, and the loader's state, are the same as without packing.
class SftLoader {
 public:
  SftLoader(const std::vector<SftExample>& examples, int64_t batch_size, RngKey key, int64_t pack_length = 0);
  data::Batch next();
  struct State {
    int64_t epoch = 0, position = 0;
    bool operator==(const State&) const = default;
  };
  State state() const { return state_; }
  void restore(const State& s);
  nlohmann::json state_json() const { return {{"epoch", state_.epoch}, {"position", state_.position}}; }
  static State state_from_json(const nlohmann::json& j);

 private:
  std::vector<int64_t> order(int64_t epoch) const;
  const std::vector<SftExample>& examples_;
  int64_t batch_size_;
  RngKey key_;
  int64_t pack_length_;
  State state_;
  std::vector<int64_t> order_;  // of state_.epoch
};

// Fixed batches of B examples in file order (validation), packed as SftLoader's when pack_length > 0.
std::vector<data::Batch> sft_fixed_batches(const std::vector<SftExample>& examples, int64_t batch_size,
                                           int64_t pack_length = 0);

}  // namespace loom::train
