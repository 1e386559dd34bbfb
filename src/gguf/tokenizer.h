// The tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*), as a loom byte-level BPE
// tokenizer, and the metadata loom writes for one of its tokenizers.
//
// What is read (llama.cpp's names):
//   tokenizer.ggml.model       must be "gpt2" (byte-level BPE); "llama" (SentencePiece) and others are
//                              refused by name
//   tokenizer.ggml.pre         the pre-tokenizer; those whose regex is GPT-2's are accepted (see
//                              kGpt2PreTokenizers), others refused by name. "smollm" is accepted with
//                              GPT-2's regex too: transformers' GGUF loader (the oracle here) uses plain
//                              ByteLevel for it, while llama.cpp first isolates each digit (docs/gguf.md)
//   tokenizer.ggml.tokens      byte-level text, or a control/user-defined token's own text
//   tokenizer.ggml.token_type  1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused; 3 and 4 become
//                              special tokens (matched in text before pre-tokenization, as llama.cpp
//                              does); 6 (SentencePiece byte tokens) is refused
//   tokenizer.ggml.merges      "left right" in rank order
//   tokenizer.ggml.unknown_token_id   the unknown token, fused over runs (transformers' GGUF tokenizer
//                              does the same): the stand-in for bytes the vocabulary lacks
//   tokenizer.ggml.bos_token_id / eos_token_id / chat_template: returned alongside
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gguf/format.h"
#include "tokenizer/tokenizer.h"

namespace loom::gguf {

struct GgufTokenizer {
  tokenizer::Tokenizer tokenizer;
  std::optional<tokenizer::TokenId> bos, eos;
  std::string pre;            // tokenizer.ggml.pre, or "" when absent
  std::string chat_template;  // tokenizer.chat_template, or ""
};

// Whether the file has tokenizer metadata at all (tokenizer.ggml.model).
bool has_tokenizer(const Header& h);
// Throws loom::Error naming the key and value that loom cannot read.
GgufTokenizer tokenizer_from_gguf(const Header& h);

// tokenizer.ggml.* for `tok` (model "gpt2", pre "gpt-2", token types 3 for special tokens), with bos/eos
// and the chat template when given.
std::vector<KeyValue> tokenizer_metadata(const tokenizer::Tokenizer& tok, std::optional<tokenizer::TokenId> bos,
                                         std::optional<tokenizer::TokenId> eos, const std::string& chat_template);

}  // namespace loom::gguf
