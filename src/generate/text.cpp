#include "generate/text.h"

namespace loom::generate {

std::vector<int32_t> prompt_ids(const tokenizer::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  for (auto id : tok.encode(text)) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

int32_t default_stop_token(const tokenizer::Tokenizer& tok, std::optional<tokenizer::TokenId> eos) {
  if (eos) return static_cast<int32_t>(*eos);
  if (auto eot = tok.special_token_id("<|endoftext|>")) return static_cast<int32_t>(*eot);
  return -1;
}

}  // namespace loom::generate
