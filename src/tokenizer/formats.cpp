#include "tokenizer/formats.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/sha256.h"

namespace loom::tokenizer {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw IoError(str("cannot read ", path, ": it is a directory"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot open ", path, ": ", std::strerror(errno)));
  std::string data;
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size > 0) {
    data.resize(static_cast<size_t>(size));
    in.seekg(0);
    in.read(data.data(), size);
  } else {  // not seekable (a pipe): read to the end
    in.clear();
    in.seekg(0);
    data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (in.bad()) throw IoError(str("error reading ", path));
  return data;
}

// Atomically (a temporary file beside it, then a rename): a failed write leaves an existing file as it
// was, and a file in a read-only directory is not rewritten in place (issue 32).
void write_file(const std::string& path, std::string_view data) {
  io::write_file_atomically(path, [&](io::FileWriter& out) { out.write(data.data(), data.size()); });
}

namespace {

using io::brief_json;
using io::brief_text;

// Builds the vocabulary from (text key -> id) entries, where `raw` says a key is a special token's own
// text rather than byte-level text. Hash maps and vectors only: GPT-2's 50k entries load in ~10 ms.
struct VocabBuilder {
  std::string source;
  // How many entries the file lists: ids must be contiguous from 0 (build() checks), so a larger id is
  // an error, found before by_id is resized to it (an id of 2^30 in a 9 KB file once asked for 34 GB;
  // fuzz/tokenizer_json_fuzz.cpp found it).
  uint64_t entries = 0;
  std::vector<std::string> by_id;
  std::vector<bool> present;
  std::unordered_map<std::string, uint32_t> id_of_key;

  void add(const std::string& key, uint64_t id, bool raw) {
    LOOM_CHECK(id < entries, source, ": vocabulary entry \"", brief_text(key), "\" has id ", id,
               ", but the file lists only ", entries, " tokens, so ids must be below ", entries);
    std::string bytes;
    if (raw) {
      bytes = key;
    } else {
      auto decoded = byte_level_to_bytes(key);
      LOOM_CHECK(decoded.has_value(), source, ": vocabulary entry \"", brief_text(key),
                 "\" is not byte-level text (and is not an added/special token)");
      bytes = std::move(*decoded);
    }
    if (id >= by_id.size()) {
      by_id.resize(id + 1);
      present.resize(id + 1, false);
    }
    LOOM_CHECK(!present[id] || by_id[id] == bytes, source, ": id ", id, " is given to both \"",
               brief_text(bytes_to_byte_level(by_id[id])), "\" and \"", brief_text(key), "\"");
    by_id[id] = std::move(bytes);
    present[id] = true;
    id_of_key.emplace(key, static_cast<uint32_t>(id));
  }

  void add_json(const std::string& key, const json& id_value, bool raw) {
    LOOM_CHECK(id_value.is_number_unsigned() || (id_value.is_number_integer() && id_value.get<int64_t>() >= 0),
               source, ": vocabulary entry \"", brief_text(key), "\" has id ", brief_json(id_value),
               ", not a non-negative integer");
    add(key, id_value.get<uint64_t>(), raw);
  }

  std::vector<std::string> build() {
    LOOM_CHECK(!by_id.empty(), source, ": the vocabulary is empty");
    for (size_t id = 0; id < by_id.size(); ++id) {
      LOOM_CHECK(present[id], source, ": vocabulary ids are not contiguous: no token has id ", id, " (the largest is ",
                 by_id.size() - 1, ")");
    }
    return std::move(by_id);
  }

  TokenId lookup(const std::string& key, size_t line) const {
    auto it = id_of_key.find(key);
    LOOM_CHECK(it != id_of_key.end(), source, ": merge ", line, " names \"", brief_text(key),
               "\", which is not in the vocabulary");
    return static_cast<TokenId>(it->second);
  }
};

// SAX reader for vocab.json, a flat {"token": id, ...} object: no DOM, so no 50k-node std::map.
struct FlatVocabSax : nlohmann::json_sax<json> {
  std::vector<std::pair<std::string, uint64_t>> entries;
  std::string key_, error_;
  int depth_ = 0;
  bool fail(const std::string& what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  bool null() override { return fail("null where a token id was expected"); }
  bool boolean(bool) override { return fail("a boolean where a token id was expected"); }
  bool number_integer(number_integer_t v) override {
    if (depth_ != 1 || v < 0) return fail(str("token \"", brief_text(key_), "\" has id ", v));
    entries.emplace_back(std::move(key_), static_cast<uint64_t>(v));
    return true;
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ != 1) return fail("nested value");
    entries.emplace_back(std::move(key_), v);
    return true;
  }
  bool number_float(number_float_t, const string_t&) override {
    return fail(str("token \"", brief_text(key_), "\" has a fractional id"));
  }
  bool string(string_t&) override { return fail(str("token \"", brief_text(key_), "\" has a string id")); }
  bool binary(binary_t&) override { return fail("binary value"); }
  bool start_object(std::size_t) override { return ++depth_ == 1 || fail("expected a flat object of token -> id"); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return fail("vocab.json must be a JSON object of token -> id"); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(str("not valid JSON (", io::brief_parse_error(e.what()), ")"));
  }
};

std::pair<std::string, std::string> split_merge_line(std::string_view line, const std::string& source, size_t index) {
  const size_t space = line.find(' ');
  LOOM_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string_view::npos,
             source, ": merge ", index, " is \"", brief_text(line), "\", expected two tokens separated by one space");
  return {std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

// obj[field] as a T (std::string or bool), or `fallback` when absent or null. nlohmann's value() would
// throw its own type_error for a value of another type (found by fuzz/tokenizer_json_fuzz.cpp).
template <typename T>
T field_or(const json& obj, const char* field, T fallback, const std::string& source, const char* where) {
  if (!obj.contains(field) || obj[field].is_null()) return fallback;
  const json& v = obj[field];
  constexpr bool is_string = std::is_same_v<T, std::string>;
  LOOM_CHECK(is_string ? v.is_string() : v.is_boolean(), source, ": ", where, ".", field, " must be ",
             is_string ? "a string" : "true or false", ", got ", brief_json(v));
  return v.get<T>();
}

void check_type(const json& j, const char* field, const char* expected, const std::string& source) {
  if (!j.contains(field) || j[field].is_null()) return;
  const json& v = j[field];
  LOOM_CHECK(v.is_object() && field_or<std::string>(v, "type", "", source, field) == expected, source, ": ", field,
             " must be ", expected, " (a byte-level BPE tokenizer), got ", brief_json(v));
}

}  // namespace

Tokenizer tokenizer_from_hf_json(std::string_view json_text, const std::string& source) {
  json j = io::parse_json(json_text, source, io::kTokenizerJsonLimits);
  LOOM_CHECK(j.is_object(), source, ": expected a JSON object at the top");
  LOOM_CHECK(j.contains("model") && j["model"].is_object(), source, ": no \"model\" object");
  const json& model = j["model"];
  const std::string type = field_or<std::string>(model, "type", "BPE", source, "model");
  LOOM_CHECK(type == "BPE", source, ": model type is \"", brief_text(type), "\", only BPE is supported");
  LOOM_CHECK(model.contains("vocab") && model["vocab"].is_object(), source, ": model has no \"vocab\" object");
  LOOM_CHECK(model.contains("merges") && model["merges"].is_array(), source, ": model has no \"merges\" array");
  // No normalizer, or an empty sequence of them (what transformers writes for a GGUF's tokenizer).
  const bool no_normalizer = !j.contains("normalizer") || j["normalizer"].is_null() ||
                             (j["normalizer"].is_object() && j["normalizer"].value("type", json()) == "Sequence" &&
                              j["normalizer"].contains("normalizers") && j["normalizer"]["normalizers"].is_array() &&
                              j["normalizer"]["normalizers"].empty());
  LOOM_CHECK(no_normalizer, source, ": a normalizer is not supported (byte-level BPE has none), got ",
             brief_json(j["normalizer"]));
  check_type(j, "pre_tokenizer", "ByteLevel", source);
  check_type(j, "decoder", "ByteLevel", source);
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    LOOM_CHECK(!field_or(j["pre_tokenizer"], "add_prefix_space", false, source, "pre_tokenizer"), source,
               ": pre_tokenizer.add_prefix_space=true is not supported (GPT-2 does not add a prefix space)");
    LOOM_CHECK(field_or(j["pre_tokenizer"], "use_regex", true, source, "pre_tokenizer"), source,
               ": pre_tokenizer.use_regex=false is not supported (GPT-2 splits with its regex)");
  }

  const bool has_added = j.contains("added_tokens") && j["added_tokens"].is_array();
  VocabBuilder vb{source, model["vocab"].size() + (has_added ? j["added_tokens"].size() : 0), {}, {}, {}};
  std::vector<std::string> specials;
  std::map<uint64_t, std::string> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    LOOM_CHECK(j["added_tokens"].is_array(), source, ": added_tokens is not an array");
    for (const json& t : j["added_tokens"]) {
      LOOM_CHECK(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string(), source,
                 ": an added token lacks \"id\" or \"content\": ", brief_json(t));
      const std::string content = t["content"].get<std::string>();
      vb.add_json(content, t["id"], /*raw=*/true);
      added[t["id"].get<uint64_t>()] = content;
      // Hugging Face matches every added token before pre-tokenization, special or not.
      specials.push_back(content);
    }
  }
  for (auto& [key, id] : model["vocab"].items()) {
    LOOM_CHECK(id.is_number_integer(), source, ": vocabulary entry \"", brief_text(key), "\" has id ", brief_json(id));
    auto a = added.find(id.get<uint64_t>());
    if (a != added.end()) {
      vb.id_of_key.emplace(key, a->first);  // listed in both places, as HF writes them
      continue;
    }
    vb.add_json(key, id, /*raw=*/false);
  }
  std::vector<std::string> vocab = vb.build();

  std::vector<std::pair<TokenId, TokenId>> merges;
  const json& jm = model["merges"];
  merges.reserve(jm.size());
  for (size_t i = 0; i < jm.size(); ++i) {
    std::pair<std::string, std::string> parts;
    if (jm[i].is_string()) {
      parts = split_merge_line(jm[i].get<std::string>(), source, i);
    } else {
      LOOM_CHECK(jm[i].is_array() && jm[i].size() == 2 && jm[i][0].is_string() && jm[i][1].is_string(), source,
                 ": merge ", i, " is ", brief_json(jm[i]), ", expected \"a b\" or [\"a\", \"b\"]");
      parts = {jm[i][0].get<std::string>(), jm[i][1].get<std::string>()};
    }
    merges.emplace_back(vb.lookup(parts.first, i), vb.lookup(parts.second, i));
  }
  // The unknown token stands in for bytes the vocabulary lacks (tokenizer.h); tokenizers' BPE with
  // byte_fallback would first try a "<0xNN>" token, which byte-level vocabularies do not have.
  const std::string unk = field_or<std::string>(model, "unk_token", "", source, "model");
  const bool fuse_unk = field_or(model, "fuse_unk", false, source, "model");
  const bool byte_fallback = field_or(model, "byte_fallback", false, source, "model");
  std::optional<TokenId> unk_id;
  if (!unk.empty()) {
    auto it = vb.id_of_key.find(unk);
    LOOM_CHECK(it != vb.id_of_key.end(), source, ": model.unk_token \"", brief_text(unk), "\" is not in the vocabulary");
    unk_id = it->second;
  }
  try {
    Tokenizer tok(std::move(vocab), std::move(merges), std::move(specials));
    tok.set_unknown_token(unk_id, fuse_unk);
    if (byte_fallback) {
      for (uint8_t b : tok.missing_bytes()) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        LOOM_CHECK(!tok.token_id(name), "model.byte_fallback with a \"", name,
                   "\" token for a byte the byte-level vocabulary lacks is not supported");
      }
    }
    return tok;
  } catch (const Error& e) {
    LOOM_FAIL(source, ": ", e.what());
  }
}

Tokenizer tokenizer_from_gpt2_files(std::string_view vocab_json, std::string_view merges_txt, const std::string& source) {
  io::check_json_limits(vocab_json, source, io::kTokenizerJsonLimits);
  FlatVocabSax sax;
  const bool ok = json::sax_parse(vocab_json, &sax);
  LOOM_CHECK(ok && sax.error_.empty(), source, ": ", sax.error_.empty() ? "not valid JSON" : sax.error_);
  LOOM_CHECK(sax.depth_ == 0 && !sax.entries.empty(), source, ": vocab.json must be a JSON object of token -> id");
  VocabBuilder vb{source, sax.entries.size(), {}, {}, {}};
  vb.id_of_key.reserve(sax.entries.size());
  std::vector<std::string> specials;
  for (auto& [key, id] : sax.entries) {
    const bool raw = !byte_level_to_bytes(key).has_value();
    vb.add(key, id, raw);
    if (raw || key == "<|endoftext|>") specials.push_back(key);
  }
  std::vector<std::string> vocab = vb.build();

  std::vector<std::pair<TokenId, TokenId>> merges;
  size_t pos = 0, index = 0;
  bool first = true;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool version = first && line.starts_with("#version");
    first = false;
    if (line.empty() || version) continue;
    auto [a, b] = split_merge_line(line, source, index);
    merges.emplace_back(vb.lookup(a, index), vb.lookup(b, index));
    ++index;
  }
  try {
    return Tokenizer(std::move(vocab), std::move(merges), std::move(specials));
  } catch (const Error& e) {
    LOOM_FAIL(source, ": ", e.what());
  }
}

namespace {
struct Gpt2Paths {
  std::string vocab, merges;
};
Gpt2Paths gpt2_paths(const std::string& dir) {
  for (auto [v, m] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
    fs::path pv = fs::path(dir) / v, pm = fs::path(dir) / m;
    if (fs::exists(pv) && fs::exists(pm)) return {pv.string(), pm.string()};
  }
  throw IoError(str("tokenizer directory ", dir, " has neither vocab.json + merges.txt nor encoder.json + vocab.bpe"));
}
}  // namespace

Tokenizer load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw IoError(str("tokenizer ", path, " does not exist"));
  if (fs::is_directory(path, ec)) {
    Gpt2Paths p = gpt2_paths(path);
    return tokenizer_from_gpt2_files(read_file(p.vocab), read_file(p.merges), p.vocab + " + " + p.merges);
  }
  return tokenizer_from_hf_json(read_file(path), path);
}

std::string tokenizer_hash(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    Gpt2Paths p = gpt2_paths(path);
    Sha256 h;
    h.update(read_file(p.vocab));
    h.update(read_file(p.merges));
    return h.hex_digest();
  }
  return sha256_hex(read_file(path));
}

namespace {
// A token as vocabulary text: special tokens as themselves, the rest in the byte-level alphabet.
std::string token_key(const Tokenizer& tok, TokenId id) {
  return tok.is_special(id) ? tok.token_bytes(id) : bytes_to_byte_level(tok.token_bytes(id));
}
}  // namespace

namespace {
std::string quoted(const std::string& s) { return json(s).dump(); }

// {"key": id, ...} in id order, written directly: nlohmann's ordered_json finds keys by linear search,
// which is quadratic over 50k entries.
std::string vocab_object(const Tokenizer& tok, const std::string& indent) {
  std::string out = "{";
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    out += id ? ",\n" : "\n";
    out += indent + "  " + quoted(token_key(tok, id)) + ": " + std::to_string(id);
  }
  return out + "\n" + indent + "}";
}
}  // namespace

std::string to_hf_json(const Tokenizer& tok) {
  std::vector<TokenId> special_ids;
  for (const std::string& s : tok.special_tokens()) special_ids.push_back(*tok.special_token_id(s));
  std::sort(special_ids.begin(), special_ids.end());
  std::string added = "[";
  for (size_t i = 0; i < special_ids.size(); ++i) {
    const TokenId id = special_ids[i];
    added += i ? ",\n    " : "\n    ";
    added += "{\"id\": " + std::to_string(id) + ", \"content\": " + quoted(tok.token_bytes(id)) +
             ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
             "\"special\": true}";
  }
  added += special_ids.empty() ? "]" : "\n  ]";
  std::string merges = "[";
  for (size_t i = 0; i < tok.merges().size(); ++i) {
    auto [a, b] = tok.merges()[i];
    merges += i ? ",\n      " : "\n      ";
    merges += "[" + quoted(token_key(tok, a)) + ", " + quoted(token_key(tok, b)) + "]";
  }
  merges += tok.merges().empty() ? "]" : "\n    ]";
  const std::string byte_level =
      "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}";
  std::string out = "{\n";
  out += "  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": " + added + ",\n";
  out += "  \"normalizer\": null,\n";
  out += "  \"pre_tokenizer\": " + byte_level + ",\n";
  out += "  \"post_processor\": null,\n";
  out += "  \"decoder\": " + byte_level + ",\n";
  const std::string unk = tok.unknown_token() ? quoted(token_key(tok, *tok.unknown_token())) : "null";
  out += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": " + unk + ",\n";
  out += std::string("    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": ") +
         (tok.fuse_unknown() ? "true" : "false") + ",\n"
         "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n";
  out += "    \"vocab\": " + vocab_object(tok, "    ") + ",\n";
  out += "    \"merges\": " + merges + "\n  }\n}\n";
  return out;
}

void save_hf_json(const Tokenizer& tok, const std::string& path) { write_file(path, to_hf_json(tok)); }

std::string to_gpt2_vocab_json(const Tokenizer& tok) { return vocab_object(tok, "") + "\n"; }

std::string to_gpt2_merges_txt(const Tokenizer& tok) {
  std::string out = "#version: 0.2\n";
  for (auto [a, b] : tok.merges()) out += token_key(tok, a) + " " + token_key(tok, b) + "\n";
  return out;
}

void save_gpt2_files(const Tokenizer& tok, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_CHECK(!ec, "cannot create directory ", dir, ": ", ec.message());
  write_file((fs::path(dir) / "vocab.json").string(), to_gpt2_vocab_json(tok));
  write_file((fs::path(dir) / "merges.txt").string(), to_gpt2_merges_txt(tok));
}

void save_tokenizer(const Tokenizer& tok, const std::string& path) {
  if (path.ends_with(".json")) {
    save_hf_json(tok, path);
  } else {
    save_gpt2_files(tok, path);
  }
}

}  // namespace loom::tokenizer
