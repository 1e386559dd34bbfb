#include "data/provenance.h"
#include "io/json.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/formats.h"
#include "tokenizer/sha256.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

// The first 12 hex digits: enough to tell two tokenizers apart in a message.
std::string short_hash(const std::string& h) { return h.empty() ? "none recorded" : h.substr(0, 12); }

std::string recorded_string(const nlohmann::json& j, const char* key, const std::string& meta_path) {
  if (!j.contains(key) || j[key].is_null()) return "";
  LOOM_CHECK(j[key].is_string(), "token meta: ", meta_path, ": \"", key, "\" must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

}  // namespace

std::string tokenizer_content_hash(const tokenizer::Tokenizer& tok) {
  return tokenizer::sha256_hex(tokenizer::to_hf_json(tok));
}

TokenizerIdentity identify_tokenizer(const tokenizer::Tokenizer& tok, const std::string& path) {
  TokenizerIdentity id;
  id.path = path;
  std::error_code ec;
  if (!path.empty() && fs::exists(path, ec)) id.file_hash = tokenizer::tokenizer_hash(path);
  id.content_hash = tokenizer_content_hash(tok);
  id.vocab_size = static_cast<int64_t>(tok.vocab_size());
  return id;
}

TokenizerIdentity identify_tokenizer(const std::string& path) {
  return identify_tokenizer(tokenizer::load_tokenizer(path), path);
}

TokenProvenance read_provenance(const std::string& meta_path) {
  const std::string text = tokenizer::read_file(meta_path);
  nlohmann::json j = io::try_parse_json(text);
  LOOM_CHECK(!j.is_discarded() && j.is_object(), "token meta: ", meta_path, " must hold a JSON object");
  TokenProvenance p;
  p.meta_path = meta_path;
  p.tokenizer_path = recorded_string(j, "tokenizer", meta_path);
  p.tokenizer_hash = recorded_string(j, "tokenizer_hash", meta_path);
  p.tokenizer_content_hash = recorded_string(j, "tokenizer_content_hash", meta_path);
  if (j.contains("vocab_size") && j["vocab_size"].is_number_integer()) p.vocab_size = j["vocab_size"].get<int64_t>();
  return p;
}

bool made_by(const TokenizerIdentity& tok, const TokenProvenance& p) {
  if (!p.records_tokenizer()) return true;
  if (!p.tokenizer_hash.empty() && tok.file_hash == p.tokenizer_hash) return true;
  if (!p.tokenizer_content_hash.empty()) return tok.content_hash == p.tokenizer_content_hash;
  // An older meta.json (file hash only): compare contents through the recorded tokenizer, if it is still
  // the file that made the tokens.
  std::error_code ec;
  if (p.tokenizer_path.empty() || !fs::exists(p.tokenizer_path, ec)) return false;
  if (tokenizer::tokenizer_hash(p.tokenizer_path) != p.tokenizer_hash) return false;
  return tokenizer_content_hash(tokenizer::load_tokenizer(p.tokenizer_path)) == tok.content_hash;
}

void check_made_by(const TokenizerIdentity& tok, const TokenProvenance& p, const std::string& role) {
  if (made_by(tok, p)) return;
  const std::string recorded_hash = p.tokenizer_hash.empty() ? p.tokenizer_content_hash : p.tokenizer_hash;
  LOOM_FAIL(role, " = ", tok.path, " (sha256 ", short_hash(tok.file_hash.empty() ? tok.content_hash : tok.file_hash),
            ", vocab_size ", tok.vocab_size, ") is not the tokenizer that made the token files of ", p.meta_path,
            " (tokenizer ", p.tokenizer_path.empty() ? "unnamed" : p.tokenizer_path, ", sha256 ", short_hash(recorded_hash),
            ", vocab_size ", p.vocab_size,
            "): their ids mean other text. Use that tokenizer, or prepare the data again with this one (loom prepare)");
}

void check_tokenizer_fits_model(const TokenizerIdentity& tok, int64_t model_vocab, const std::string& model) {
  LOOM_CHECK(tok.vocab_size <= model_vocab, "the tokenizer ", tok.path, " has ", tok.vocab_size,
             " tokens, more than the model's vocab_size=", model_vocab, " (", model, "): ids from ", model_vocab,
             " up have no row in the model's embedding table");
}

void check_tokens_fit_model(const TokenFile& tokens, int64_t model_vocab, const std::string& model) {
  const uint32_t top = tokens.max_token();
  LOOM_CHECK(static_cast<int64_t>(top) < model_vocab, tokens.path(), " holds token id ", top,
             ", outside the model's vocab_size=", model_vocab, " (", model, ")");
}

}  // namespace loom::data
