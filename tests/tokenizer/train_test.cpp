// BPE training: the CS336 rules (against a slow Python oracle and hand-made examples), thread-count
// independence, formats round trips, and the errors users get.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/sha256.h"
#include "support/errors.h"

using namespace loom;
using loom::test::error_of;
using namespace loom::tokenizer;
using namespace loom::tokenizer::testing;

namespace {
std::string hex_to_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}
std::vector<std::pair<std::string, std::string>> merge_bytes(const Tokenizer& tok) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto [a, b] : tok.merges()) out.emplace_back(tok.token_bytes(a), tok.token_bytes(b));
  return out;
}
}  // namespace

TEST(Train, MatchesSlowPythonReference) {
  auto ref = nlohmann::json::parse(read_text(fixture("train_reference.json")));
  TrainOptions o;
  o.vocab_size = ref["vocab_size"].get<size_t>();
  o.special_tokens = ref["special_tokens"].get<std::vector<std::string>>();
  Tokenizer tok = train_bpe_on_text(ref["corpus"].get<std::string>(), o);
  std::vector<std::pair<std::string, std::string>> expect;
  for (const auto& m : ref["merges_hex"]) expect.emplace_back(hex_to_bytes(m[0]), hex_to_bytes(m[1]));
  ASSERT_EQ(expect.size(), o.vocab_size - 257);
  EXPECT_EQ(merge_bytes(tok), expect);
  // Specials first, then the 256 bytes, then the merges.
  EXPECT_EQ(tok.token_bytes(0), "<|endoftext|>");
  EXPECT_EQ(tok.token_bytes(1 + 'a'), "a");
  EXPECT_EQ(tok.vocab_size(), o.vocab_size);
}

TEST(Train, TiesGoToTheLexicographicallyGreatestPair) {
  TrainOptions o;
  o.special_tokens = {"<|s|>"};
  o.vocab_size = 256 + 1 + 3;
  // Three words, each once: (a,b), (c,d), (b,a) all have count 1. Greatest first: (c,d), (b,a), (a,b).
  Tokenizer tok = train_bpe_on_text("ab<|s|>cd<|s|>ba", o);
  using P = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(merge_bytes(tok), (P{{"c", "d"}, {"b", "a"}, {"a", "b"}}));

  // Equal left tokens: the right one decides. A higher count beats any tie-break.
  o.vocab_size = 256 + 1 + 2;
  tok = train_bpe_on_text("ab<|s|>ac<|s|>zz<|s|>ab", o);
  EXPECT_EQ(merge_bytes(tok), (P{{"a", "b"}, {"z", "z"}}));
  tok = train_bpe_on_text("ab<|s|>ac", o);
  EXPECT_EQ(merge_bytes(tok), (P{{"a", "c"}, {"a", "b"}}));

  // Multi-byte tokens compare by bytes: once "ab" exists, (ab, d) and (a, e) tie at 1 and (ab, d) wins,
  // since b"ab" > b"a" (even though "e" > "d").
  o.vocab_size = 256 + 1 + 3;
  tok = train_bpe_on_text("ab<|s|>ab<|s|>abd<|s|>ae", o);
  EXPECT_EQ(merge_bytes(tok), (P{{"a", "b"}, {"ab", "d"}, {"a", "e"}}));
}

TEST(Train, NoMergeCrossesSpecialTokensOrPreTokens) {
  TrainOptions o;
  o.special_tokens = {"<|endoftext|>"};
  o.vocab_size = 300;
  Tokenizer tok = train_bpe_on_text("xy<|endoftext|>xy<|endoftext|>xy xy, xy!", o);
  for (auto& [a, b] : merge_bytes(tok)) {
    const std::string t = a + b;
    EXPECT_EQ(t.find("<|"), std::string::npos) << t;
    EXPECT_EQ(t.find("y "), std::string::npos) << t;  // " xy" is a pre-token, "y " never is
  }
}

TEST(Train, SameMergesOnOneAndTwoThreads) {
  const std::string text = random_text(400000, 17) + "<|endoftext|>" + random_text(100000, 18);
  TrainOptions o;
  o.vocab_size = 800;
  o.special_tokens = {"<|endoftext|>"};
  o.chunk_bytes = 4096;  // many chunks
  o.threads = 1;
  Tokenizer one = train_bpe_on_text(text, o);
  o.threads = 2;
  Tokenizer two = train_bpe_on_text(text, o);
  EXPECT_EQ(one.merges(), two.merges());
  EXPECT_EQ(one.vocab(), two.vocab());
  o.chunk_bytes = size_t{1} << 24;  // one chunk: chunking itself must not change the counts
  o.threads = 1;
  EXPECT_EQ(train_bpe_on_text(text, o).merges(), one.merges());
}

TEST(Train, StopsWhenNoPairIsLeft) {
  TrainOptions o;
  o.vocab_size = 1000;
  Tokenizer tok = train_bpe_on_text("abcd", o);
  EXPECT_EQ(tok.vocab_size(), 256u + 3u);
  EXPECT_EQ(tok.encode("abcd"), (std::vector<TokenId>{258}));
}

TEST(Train, ErrorsNameTheProblem) {
  TrainOptions o;
  o.special_tokens = {"<|endoftext|>"};
  o.vocab_size = 256;
  EXPECT_NE(error_of([&] { train_bpe_on_text("hello", o); }).find("smaller than 256 bytes + 1 special"), std::string::npos);
  o.vocab_size = 300;
  EXPECT_NE(error_of([&] { train_bpe_on_text("", o); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { train_bpe_on_text("<|endoftext|><|endoftext|>", o); }).find("empty"), std::string::npos);
  EXPECT_THROW(train_bpe({"/nonexistent/corpus.txt"}, o), IoError);
  EXPECT_NE(error_of([&] { train_bpe({"/nonexistent/corpus.txt"}, o); }).find("/nonexistent/corpus.txt"),
            std::string::npos);
  o.special_tokens = {"<|x|>", "<|x|>"};
  EXPECT_NE(error_of([&] { train_bpe_on_text("hello", o); }).find("twice"), std::string::npos);
}

// ---- formats ----------------------------------------------------------------------------------------

TEST(Formats, HfJsonAndGpt2FilesRoundTrip) {
  Tokenizer tok = small_tokenizer(500);
  const std::string text = random_text(20000, 5) + "<|endoftext|>x";
  TempDir dir;
  save_hf_json(tok, dir / "tokenizer.json");
  save_gpt2_files(tok, dir / "gpt2");
  for (const std::string& path : {dir / "tokenizer.json", dir / "gpt2"}) {
    Tokenizer back = load_tokenizer(path);
    EXPECT_EQ(back.vocab(), tok.vocab()) << path;
    EXPECT_EQ(back.merges(), tok.merges()) << path;
    EXPECT_EQ(back.special_tokens(), tok.special_tokens()) << path;
    EXPECT_EQ(back.encode(text), tok.encode(text)) << path;
  }
  // The written file is what Hugging Face expects.
  auto j = nlohmann::json::parse(read_text(dir / "tokenizer.json"));
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_TRUE(j["added_tokens"][0]["special"].get<bool>());
  EXPECT_EQ(j["model"]["vocab"]["\u0120"], *tok.token_id(" "));
  EXPECT_TRUE(read_text(dir / "gpt2/merges.txt").starts_with("#version"));
}

TEST(Formats, MergesAsStringsOrPairsAndWithoutVersionLine) {
  Tokenizer tok = small_tokenizer(400);
  auto j = nlohmann::json::parse(to_hf_json(tok));
  for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  Tokenizer from_strings = tokenizer_from_hf_json(j.dump());
  EXPECT_EQ(from_strings.merges(), tok.merges());

  std::string merges = to_gpt2_merges_txt(tok);
  merges.erase(0, merges.find('\n') + 1);  // drop "#version: 0.2"
  Tokenizer no_version = tokenizer_from_gpt2_files(to_gpt2_vocab_json(tok), merges);
  EXPECT_EQ(no_version.merges(), tok.merges());
}

TEST(Formats, MalformedFilesGiveClearErrors) {
  Tokenizer tok = small_tokenizer(400);
  EXPECT_NE(error_of([] { tokenizer_from_hf_json("{not json", "bad.json"); }).find("bad.json is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from_hf_json("{}", "t.json"); }).find("no \"model\""), std::string::npos);
  auto j = nlohmann::json::parse(to_hf_json(tok));
  j["model"]["merges"][0] = "\u0120zzzq \u0120qq";
  EXPECT_NE(error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); }).find("not in the vocabulary"), std::string::npos);
  j = nlohmann::json::parse(to_hf_json(tok));
  j["model"]["merges"][0] = "onlyone";
  EXPECT_NE(error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); }).find("expected two tokens"), std::string::npos);
  j = nlohmann::json::parse(to_hf_json(tok));
  j["model"]["vocab"].erase("a");
  EXPECT_NE(error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); }).find("t.json"), std::string::npos);
  j = nlohmann::json::parse(to_hf_json(tok));
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of([&] { tokenizer_from_hf_json(j.dump(), "t.json"); }).find("only BPE"), std::string::npos);
  EXPECT_THROW(load_tokenizer("/nonexistent/tokenizer.json"), IoError);
  TempDir dir;
  EXPECT_THROW(load_tokenizer(dir.path()), IoError);  // a directory without vocab.json + merges.txt
  EXPECT_NE(error_of([] { tokenizer_from_gpt2_files("[1,2]", ""); }).find("JSON object"), std::string::npos);
}

TEST(Sha256, KnownVectors) {
  // FIPS 180-4 examples, and a multi-block message checked with Python's hashlib.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}
