#include "tokenizer/text_stream.h"

#include <string_view>

#include "tokenizer/pretokenizer.h"

namespace loom::tokenizer {

std::string TokenTextStream::push(TokenId id) {
  pending_ += tok_.token_bytes(id);
  const size_t complete = valid_utf8_prefix(pending_);
  std::string out = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return out;
}

std::string TokenTextStream::finish() {
  std::string rest = replace_invalid_utf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace loom::tokenizer
