// Reading and writing tokenizers in the two formats the ecosystem uses:
//   - Hugging Face `tokenizer.json`: a BPE model with a ByteLevel pre-tokenizer and decoder, its
//     vocabulary keyed by byte-level text (byte_level.h), merges as "a b" strings or ["a", "b"] pairs
//     (both are read; pairs are written), and special tokens in `added_tokens`.
//   - GPT-2's `vocab.json` (= encoder.json) + `merges.txt` (= vocab.bpe), with or without the
//     "#version" first line. Entries that are not byte-level text, and "<|endoftext|>", are special.
// Every reader throws loom::Error naming the file and what is wrong with it.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace loom::tokenizer {

// `path` is a tokenizer.json file, or a directory holding vocab.json + merges.txt (or encoder.json +
// vocab.bpe, the names OpenAI used).
Tokenizer load_tokenizer(const std::string& path);

Tokenizer tokenizer_from_hf_json(std::string_view json_text, const std::string& source = "tokenizer.json");
Tokenizer tokenizer_from_gpt2_files(std::string_view vocab_json, std::string_view merges_txt,
                                    const std::string& source = "vocab.json/merges.txt");

std::string to_hf_json(const Tokenizer& tok);
void save_hf_json(const Tokenizer& tok, const std::string& path);
std::string to_gpt2_vocab_json(const Tokenizer& tok);
std::string to_gpt2_merges_txt(const Tokenizer& tok);
// Writes dir/vocab.json and dir/merges.txt (creating dir).
void save_gpt2_files(const Tokenizer& tok, const std::string& dir);
// The counterpart of load_tokenizer: a path ending in .json gets a Hugging Face tokenizer.json
// (save_hf_json), anything else is a directory for vocab.json + merges.txt (save_gpt2_files).
void save_tokenizer(const Tokenizer& tok, const std::string& path);

// sha256 of what load_tokenizer reads at `path`: the file's bytes, or vocab.json's then merges.txt's.
std::string tokenizer_hash(const std::string& path);

// The whole file, or loom::IoError naming it.
std::string read_file(const std::string& path);
void write_file(const std::string& path, std::string_view data);

}  // namespace loom::tokenizer
