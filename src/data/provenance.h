// Which tokenizer made a folder of token files, and the checks that keep a tokenizer, token files and a
// model from being used together when they do not belong together.
//
// `loom prepare` records in meta.json the tokenizer it used: "tokenizer" (the path as given),
// "tokenizer_hash" (sha256 of its file bytes, tokenizer::tokenizer_hash) and "tokenizer_content_hash"
// (sha256 of its canonical tokenizer.json text, tokenizer::to_hf_json). A tokenizer "made" the tokens
// when its file hash equals the recorded one, or, failing that, when its content hash does: the same
// vocabulary and merges saved in another format or by another writer (a run's tokenizer.json after
// `loom import`, GPT-2's vocab.json + merges.txt) encode identically. meta.json files written before
// the content hash existed are compared through the recorded tokenizer file when it is still there.
//
// Every check runs before any compute and throws loom::Error naming both files and both values.
#pragma once

#include <cstdint>
#include <string>

#include "data/token_file.h"
#include "tokenizer/tokenizer.h"

namespace loom::data {

// A tokenizer as the checks see it.
struct TokenizerIdentity {
  std::string path;          // the file (or vocab.json + merges.txt folder) it was read from
  std::string file_hash;     // tokenizer::tokenizer_hash(path); empty when there is no file
  std::string content_hash;  // sha256 of tokenizer::to_hf_json(tokenizer)
  int64_t vocab_size = 0;
};
// Loads the tokenizer at `path` (throws naming it when it does not exist or does not parse).
TokenizerIdentity identify_tokenizer(const std::string& path);
// A tokenizer already loaded from `path` (empty when it has no file).
TokenizerIdentity identify_tokenizer(const tokenizer::Tokenizer& tok, const std::string& path);
// sha256 of the canonical tokenizer.json text of `tok`.
std::string tokenizer_content_hash(const tokenizer::Tokenizer& tok);

// What a meta.json records about the tokenizer that made its token files; empty strings (and
// vocab_size 0) for what it does not record (hand-written files, files from older versions).
struct TokenProvenance {
  std::string meta_path;
  std::string tokenizer_path;  // as `loom prepare` was given it
  std::string tokenizer_hash;
  std::string tokenizer_content_hash;
  int64_t vocab_size = 0;
  bool records_tokenizer() const { return !tokenizer_hash.empty() || !tokenizer_content_hash.empty(); }
};
// Reads meta.json (throws loom::IoError when it cannot, loom::Error naming the key when a recorded
// value has the wrong type).
TokenProvenance read_provenance(const std::string& meta_path);

// Whether `tok` is the tokenizer meta.json records (true when meta.json records none).
bool made_by(const TokenizerIdentity& tok, const TokenProvenance& p);
// Throws loom::Error unless made_by(tok, p); `role` says what the tokenizer is to the user
// ("config: data.tokenizer", "the run's tokenizer"), so the message names both files:
//   config: data.tokenizer = b.json (sha256 77fa…) is not the tokenizer that made the token files
//   of dataA/meta.json (tokenizer a.json, sha256 89c2…)
void check_made_by(const TokenizerIdentity& tok, const TokenProvenance& p, const std::string& role);

// The tokenizer's ids must all be rows of the model's embedding table: vocab_size <= model_vocab.
// `model` names where the model's vocab_size comes from ("config: model.vocab_size", "runs/x/model.safetensors").
void check_tokenizer_fits_model(const TokenizerIdentity& tok, int64_t model_vocab, const std::string& model);
// Every token id in the file must be below model_vocab (a full scan of the file).
void check_tokens_fit_model(const TokenFile& tokens, int64_t model_vocab, const std::string& model);

}  // namespace loom::data
