// Text in, tokens out: the pieces a generation from text needs around generate() (generate.h), shared by
// `loom generate`, `loom train`'s samples and Python.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace loom::generate {

// `text` encoded as a prompt (generate() takes int32 ids).
std::vector<int32_t> prompt_ids(const tokenizer::Tokenizer& tok, const std::string& text);

// The token a generation stops at: `eos` when the weights name one (a GGUF file's end-of-sequence
// token), else the tokenizer's <|endoftext|> when it has one, else -1 (GenerateOptions: never).
int32_t default_stop_token(const tokenizer::Tokenizer& tok, std::optional<tokenizer::TokenId> eos = std::nullopt);

}  // namespace loom::generate
