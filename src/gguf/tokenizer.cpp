#include "gguf/tokenizer.h"

#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace loom::gguf {
namespace {

using tokenizer::TokenId;

// llama.cpp's pre-tokenizer names whose regex is GPT-2's own (llama-vocab.cpp), plus "smollm" (see the
// header). Anything else splits text differently, and is refused rather than tokenized wrongly.
const char* const kGpt2PreTokenizers[] = {"default", "gpt-2", "gpt2", "smollm"};

enum TokenType : int64_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

std::optional<TokenId> token_id_key(const Header& h, const char* key, size_t vocab) {
  if (!h.find(key)) return std::nullopt;
  const uint64_t id = h.get_uint(key);
  LOOM_CHECK(id < vocab, "metadata ", quoted(key), " is ", id, " but the vocabulary has ", vocab, " tokens");
  return static_cast<TokenId>(id);
}

}  // namespace

bool has_tokenizer(const Header& h) { return h.find("tokenizer.ggml.model") != nullptr; }

GgufTokenizer tokenizer_from_gguf(const Header& h) {
  const std::string& model = h.get_string("tokenizer.ggml.model");
  LOOM_CHECK(model == "gpt2", "tokenizer.ggml.model is ", quoted(model),
             ": loom reads byte-level BPE tokenizers (\"gpt2\") only");
  std::string pre;
  if (h.find("tokenizer.ggml.pre")) pre = h.get_string("tokenizer.ggml.pre");
  if (!pre.empty()) {
    bool known = false;
    std::string names;
    for (const char* p : kGpt2PreTokenizers) {
      known |= pre == p;
      names += (names.empty() ? "" : ", ") + std::string(p);
    }
    LOOM_CHECK(known, "tokenizer.ggml.pre is ", quoted(pre),
               ", a pre-tokenizer loom does not have (loom splits text with GPT-2's regex: ", names, ")");
  }
  const Array& tokens = h.get_array("tokenizer.ggml.tokens");
  LOOM_CHECK(tokens.element == ValueType::String && tokens.count > 0, "tokenizer.ggml.tokens is ",
             Value{tokens}.describe(), ", expected a non-empty array of strings");
  const size_t n = static_cast<size_t>(tokens.count);
  std::vector<int64_t> types(n, Normal);
  if (h.find("tokenizer.ggml.token_type")) {
    const Array& t = h.get_array("tokenizer.ggml.token_type");
    LOOM_CHECK(t.count == tokens.count, "tokenizer.ggml.token_type has ", t.count, " entries but tokenizer.ggml.tokens has ",
               tokens.count);
    for (size_t i = 0; i < n; ++i) types[i] = t.integer(i);
  }
  std::vector<std::string> vocab(n);
  std::vector<std::string> specials;
  std::unordered_map<std::string, TokenId> id_of_text;
  id_of_text.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = tokens.string(i);
    switch (types[i]) {
      case Control:
      case UserDefined:
      case Unknown:
      case Unused:
        vocab[i] = text;
        specials.push_back(text);
        break;
      case Normal: {
        auto bytes = tokenizer::byte_level_to_bytes(text);
        LOOM_CHECK(bytes.has_value(), "tokenizer.ggml.tokens[", i, "] = ", quoted(text),
                   " is a normal token but not byte-level text");
        vocab[i] = std::move(*bytes);
        break;
      }
      default:
        LOOM_FAIL("tokenizer.ggml.token_type[", i, "] is ", types[i], " (", quoted(text),
                  "): loom reads types 1 (normal), 2 (unknown), 3 (control), 4 (user-defined) and 5 (unused)",
                  types[i] == Byte ? "; type 6 (byte) belongs to SentencePiece vocabularies" : "");
    }
    id_of_text.emplace(text, static_cast<TokenId>(i));
  }
  std::vector<std::pair<TokenId, TokenId>> merges;
  if (h.find("tokenizer.ggml.merges")) {
    const Array& m = h.get_array("tokenizer.ggml.merges");
    LOOM_CHECK(m.element == ValueType::String, "tokenizer.ggml.merges is ", Value{m}.describe(),
               ", expected an array of strings");
    merges.reserve(static_cast<size_t>(m.count));
    for (uint64_t i = 0; i < m.count; ++i) {
      const std::string& line = m.string(i);
      const size_t space = line.find(' ');
      LOOM_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                     line.find(' ', space + 1) == std::string::npos,
                 "tokenizer.ggml.merges[", i, "] is ", quoted(line), ", expected two tokens separated by one space");
      auto a = id_of_text.find(line.substr(0, space)), b = id_of_text.find(line.substr(space + 1));
      LOOM_CHECK(a != id_of_text.end() && b != id_of_text.end(), "tokenizer.ggml.merges[", i, "] = ", quoted(line),
                 " names a token that is not in tokenizer.ggml.tokens");
      merges.emplace_back(a->second, b->second);
    }
  }
  std::optional<tokenizer::Tokenizer> tok;
  try {
    tok.emplace(std::move(vocab), std::move(merges), std::move(specials));
  } catch (const Error& e) {
    LOOM_FAIL("the tokenizer in the metadata: ", e.what());
  }
  tok->set_unknown_token(token_id_key(h, "tokenizer.ggml.unknown_token_id", n), /*fuse=*/true);
  GgufTokenizer out{std::move(*tok), token_id_key(h, "tokenizer.ggml.bos_token_id", n),
                    token_id_key(h, "tokenizer.ggml.eos_token_id", n), pre, ""};
  if (h.find("tokenizer.chat_template")) out.chat_template = h.get_string("tokenizer.chat_template");
  return out;
}

std::vector<KeyValue> tokenizer_metadata(const tokenizer::Tokenizer& tok, std::optional<TokenId> bos,
                                         std::optional<TokenId> eos, const std::string& chat_template) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(tok.vocab_size());
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    const bool special = tok.is_special(id);
    tokens.push_back(special ? tok.token_bytes(id) : tokenizer::bytes_to_byte_level(tok.token_bytes(id)));
    types.push_back(special ? Control : Normal);
  }
  std::vector<std::string> merges;
  merges.reserve(tok.merges().size());
  for (auto [a, b] : tok.merges()) merges.push_back(tokens[a] + " " + tokens[b]);
  std::vector<KeyValue> kv = {
      {"tokenizer.ggml.model", Value{std::string("gpt2")}},
      {"tokenizer.ggml.pre", Value{std::string("gpt-2")}},
      {"tokenizer.ggml.tokens", string_array(tokens)},
      {"tokenizer.ggml.token_type", numeric_array(ValueType::I32, types)},
      {"tokenizer.ggml.merges", string_array(merges)},
  };
  if (bos) kv.push_back({"tokenizer.ggml.bos_token_id", Value{static_cast<uint32_t>(*bos)}});
  if (eos) kv.push_back({"tokenizer.ggml.eos_token_id", Value{static_cast<uint32_t>(*eos)}});
  if (tok.unknown_token()) kv.push_back({"tokenizer.ggml.unknown_token_id", Value{static_cast<uint32_t>(*tok.unknown_token())}});
  kv.push_back({"tokenizer.ggml.add_bos_token", Value{false}});
  if (!chat_template.empty()) kv.push_back({"tokenizer.chat_template", Value{chat_template}});
  return kv;
}

}  // namespace loom::gguf
