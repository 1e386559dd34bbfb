// Text from a stream of token ids as they come (generation, chat): a byte-level token may end in the
// middle of a UTF-8 character, so a token's bytes are not always text on their own.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace loom::tokenizer {

// push() returns the bytes that now form complete UTF-8 characters, as soon as their last byte arrives,
// and holds back the rest (a character whose bytes are split across tokens, or anything after an invalid
// byte); finish() returns what is held back with U+FFFD for what never became a valid character
// (replace_invalid_utf8). Pushed and finished, the text is decode() of all the ids; only when each part
// comes differs.
class TokenTextStream {
 public:
  explicit TokenTextStream(const Tokenizer& tok) : tok_(tok) {}
  std::string push(TokenId id);
  std::string finish();

 private:
  const Tokenizer& tok_;
  std::string pending_;  // bytes not yet returned
};

}  // namespace loom::tokenizer
