#include "tokenizer/formats.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
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

void write_file(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(str("cannot write ", path, ": ", std::strerror(errno)));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) throw IoError(str("error writing ", path));
}

namespace {

json parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    LOOM_FAIL(source, ": not valid JSON (", e.what(), ")");
  }
}

// Builds the vocabulary from (text key -> id) entries, where `raw` says a key is a special token's own
// text rather than byte-level text.
struct VocabBuilder {
  std::string source;
  std::map<uint64_t, std::string> by_id;
  std::map<std::string, uint64_t> id_of_key;

  void add(const std::string& key, const json& id_value, bool raw) {
    LOOM_CHECK(id_value.is_number_unsigned() || (id_value.is_number_integer() && id_value.get<int64_t>() >= 0),
               source, ": vocabulary entry \"", key, "\" has id ", id_value.dump(), ", not a non-negative integer");
    const uint64_t id = id_value.get<uint64_t>();
    LOOM_CHECK(id < (uint64_t{1} << 31), source, ": vocabulary entry \"", key, "\" has id ", id, ", too large");
    std::string bytes;
    if (raw) {
      bytes = key;
    } else {
      auto decoded = byte_level_to_bytes(key);
      LOOM_CHECK(decoded.has_value(), source, ": vocabulary entry \"", key,
                 "\" is not byte-level text (and is not an added/special token)");
      bytes = std::move(*decoded);
    }
    auto [it, inserted] = by_id.emplace(id, bytes);
    LOOM_CHECK(inserted || it->second == bytes, source, ": id ", id, " is given to both \"",
               bytes_to_byte_level(it->second), "\" and \"", key, "\"");
    id_of_key.emplace(key, id);
  }

  std::vector<std::string> build() const {
    LOOM_CHECK(!by_id.empty(), source, ": the vocabulary is empty");
    const uint64_t n = by_id.rbegin()->first + 1;
    LOOM_CHECK(n == by_id.size(), source, ": vocabulary ids are not contiguous (", by_id.size(),
               " entries but the largest id is ", n - 1, ")");
    std::vector<std::string> vocab;
    vocab.reserve(n);
    for (auto& [id, bytes] : by_id) vocab.push_back(bytes);
    return vocab;
  }

  TokenId lookup(const std::string& key, size_t line) const {
    auto it = id_of_key.find(key);
    LOOM_CHECK(it != id_of_key.end(), source, ": merge ", line, " names \"", key, "\", which is not in the vocabulary");
    return static_cast<TokenId>(it->second);
  }
};

std::pair<std::string, std::string> split_merge_line(std::string_view line, const std::string& source, size_t index) {
  const size_t space = line.find(' ');
  LOOM_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string_view::npos,
             source, ": merge ", index, " is \"", line, "\", expected two tokens separated by one space");
  return {std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

void check_type(const json& j, const char* field, const char* expected, const std::string& source) {
  if (!j.contains(field) || j[field].is_null()) return;
  const json& v = j[field];
  LOOM_CHECK(v.is_object() && v.value("type", "") == expected, source, ": ", field, " must be ", expected,
             " (a byte-level BPE tokenizer), got ", v.dump().substr(0, 200));
}

}  // namespace

Tokenizer tokenizer_from_hf_json(std::string_view json_text, const std::string& source) {
  json j = parse_json(json_text, source);
  LOOM_CHECK(j.is_object(), source, ": expected a JSON object at the top");
  LOOM_CHECK(j.contains("model") && j["model"].is_object(), source, ": no \"model\" object");
  const json& model = j["model"];
  LOOM_CHECK(model.value("type", "BPE") == "BPE", source, ": model type is \"", model.value("type", ""),
             "\", only BPE is supported");
  LOOM_CHECK(model.contains("vocab") && model["vocab"].is_object(), source, ": model has no \"vocab\" object");
  LOOM_CHECK(model.contains("merges") && model["merges"].is_array(), source, ": model has no \"merges\" array");
  LOOM_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), source,
             ": a normalizer is not supported (byte-level BPE has none)");
  check_type(j, "pre_tokenizer", "ByteLevel", source);
  check_type(j, "decoder", "ByteLevel", source);
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    LOOM_CHECK(!j["pre_tokenizer"].value("add_prefix_space", false), source,
               ": pre_tokenizer.add_prefix_space=true is not supported (GPT-2 does not add a prefix space)");
    LOOM_CHECK(j["pre_tokenizer"].value("use_regex", true), source,
               ": pre_tokenizer.use_regex=false is not supported (GPT-2 splits with its regex)");
  }

  VocabBuilder vb{source, {}, {}};
  std::vector<std::string> specials;
  std::map<uint64_t, std::string> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    LOOM_CHECK(j["added_tokens"].is_array(), source, ": added_tokens is not an array");
    for (const json& t : j["added_tokens"]) {
      LOOM_CHECK(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string(), source,
                 ": an added token lacks \"id\" or \"content\": ", t.dump().substr(0, 200));
      const std::string content = t["content"].get<std::string>();
      vb.add(content, t["id"], /*raw=*/true);
      added[t["id"].get<uint64_t>()] = content;
      // Hugging Face matches every added token before pre-tokenization, special or not.
      specials.push_back(content);
    }
  }
  for (auto& [key, id] : model["vocab"].items()) {
    LOOM_CHECK(id.is_number_integer(), source, ": vocabulary entry \"", key, "\" has id ", id.dump());
    auto a = added.find(id.get<uint64_t>());
    if (a != added.end()) {
      vb.id_of_key.emplace(key, a->first);  // listed in both places, as HF writes them
      continue;
    }
    vb.add(key, id, /*raw=*/false);
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
                 ": merge ", i, " is ", jm[i].dump().substr(0, 200), ", expected \"a b\" or [\"a\", \"b\"]");
      parts = {jm[i][0].get<std::string>(), jm[i][1].get<std::string>()};
    }
    merges.emplace_back(vb.lookup(parts.first, i), vb.lookup(parts.second, i));
  }
  try {
    return Tokenizer(std::move(vocab), std::move(merges), std::move(specials));
  } catch (const Error& e) {
    LOOM_FAIL(source, ": ", e.what());
  }
}

Tokenizer tokenizer_from_gpt2_files(std::string_view vocab_json, std::string_view merges_txt, const std::string& source) {
  json j = parse_json(vocab_json, source);
  LOOM_CHECK(j.is_object(), source, ": vocab.json must be a JSON object of token -> id");
  VocabBuilder vb{source, {}, {}};
  std::vector<std::string> specials;
  for (auto& [key, id] : j.items()) {
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

std::string to_hf_json(const Tokenizer& tok) {
  ordered_json added = ordered_json::array();
  std::vector<TokenId> special_ids;
  for (const std::string& s : tok.special_tokens()) special_ids.push_back(*tok.special_token_id(s));
  std::sort(special_ids.begin(), special_ids.end());
  for (TokenId id : special_ids) {
    added.push_back({{"id", id},
                     {"content", tok.token_bytes(id)},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  for (TokenId id = 0; id < tok.vocab_size(); ++id) vocab[token_key(tok, id)] = id;
  ordered_json merges = ordered_json::array();
  for (auto [a, b] : tok.merges()) merges.push_back({token_key(tok, a), token_key(tok, b)});
  ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", true}};
  ordered_json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", byte_level},
                    {"post_processor", nullptr},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  return j.dump(2, ' ', false, json::error_handler_t::strict) + "\n";
}

void save_hf_json(const Tokenizer& tok, const std::string& path) { write_file(path, to_hf_json(tok)); }

std::string to_gpt2_vocab_json(const Tokenizer& tok) {
  ordered_json vocab = ordered_json::object();
  for (TokenId id = 0; id < tok.vocab_size(); ++id) vocab[token_key(tok, id)] = id;
  return vocab.dump() + "\n";
}

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

}  // namespace loom::tokenizer
