// Encoding and decoding: GPT-2's exact ids (tiktoken fixtures), round trips, special tokens, U+FFFD,
// pre-tokenization and chunking, streaming.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"

using namespace loom;
using namespace loom::tokenizer;
using namespace loom::tokenizer::testing;

TEST(ByteLevel, AllBytesRoundTripAndGpt2Names) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string text = bytes_to_byte_level(all);
  auto back = byte_level_to_bytes(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, all);
  EXPECT_EQ(bytes_to_byte_level(" "), "\u0120");   // Ġ
  EXPECT_EQ(bytes_to_byte_level("\n"), "\u010a");  // Ċ
  EXPECT_EQ(bytes_to_byte_level("Az~"), "Az~");
  EXPECT_FALSE(byte_level_to_bytes("\u4e00").has_value());  // not in the 256-character alphabet
  EXPECT_FALSE(byte_level_to_bytes(" ").has_value());       // a raw space is not byte-level text
}

std::vector<std::string> pieces(std::string_view text) {
  PreTokenizer pre;
  PreTokenizer::MatchData md(pre);
  std::vector<std::string> out;
  pre.for_each(text, md, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(PreTokenizer, Gpt2RegexPieces) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm here  now"), (V{"I", "'m", " here", " ", " now"}));
  EXPECT_EQ(pieces("a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(pieces("x   "), (V{"x", "   "}));
  EXPECT_EQ(pieces("abc123!!? d"), (V{"abc", "123", "!!?", " d"}));
  EXPECT_EQ(pieces("caf\u00e9 \u65e5\u672c"), (V{"caf\u00e9", " \u65e5\u672c"}));
  EXPECT_EQ(pieces("a\u00a0b"), (V{"a", "\u00a0", "b"}));  // NBSP is whitespace
  // Invalid UTF-8 stays lossless: the bad bytes are a piece of their own.
  EXPECT_EQ(pieces("ab\xff\xfe cd"), (V{"ab", "\xff\xfe", " cd"}));
  EXPECT_TRUE(pieces("").empty());
}

TEST(PreTokenizer, SplitPointsGiveTheSamePiecesAsTheWholeText) {
  PreTokenizer pre;
  PreTokenizer::MatchData md(pre);
  SpecialTokenMatcher specials({"<|endoftext|>", "<|end|>"});
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::string text = random_text(3000, seed);
    text.insert(1000, "<|endoftext|>");
    // The pieces of each part between special tokens, for a text cut at `cuts`.
    auto all_pieces = [&](const std::vector<std::string_view>& parts) {
      std::vector<std::string> out;
      for (std::string_view part : parts) {
        size_t from = 0;
        while (true) {
          auto m = specials.find(part, from);
          size_t end = m ? m->begin : part.size();
          pre.for_each(part.substr(from, end - from), md, [&](std::string_view p) { out.emplace_back(p); });
          if (!m) break;
          out.emplace_back(part.substr(m->begin, m->length));
          from = m->begin + m->length;
        }
      }
      return out;
    };
    std::vector<std::string_view> parts;
    std::string_view rest = text;
    while (rest.size() > 200) {
      size_t p = find_split_point(rest.substr(0, 200), specials, pre, md);
      ASSERT_GT(p, 0u);
      parts.push_back(rest.substr(0, p));
      rest.remove_prefix(p);
    }
    parts.push_back(rest);
    EXPECT_EQ(all_pieces(parts), all_pieces({text})) << "seed " << seed;
  }
}

TEST(PreTokenizer, SplitPointFallsBackToTheRegexWithoutAsciiBoundaries) {
  PreTokenizer pre;
  PreTokenizer::MatchData md(pre);
  SpecialTokenMatcher none;
  std::string cjk;
  for (int i = 0; i < 200; ++i) cjk += i % 7 == 6 ? "\u3002" : "\u65e5\u672c";  // no ASCII at all
  const size_t p = find_split_point(cjk, none, pre, md);
  ASSERT_GT(p, 0u);
  std::vector<std::string> whole = pieces(cjk), parts = pieces(std::string_view(cjk).substr(0, p));
  auto tail = pieces(std::string_view(cjk).substr(p));
  parts.insert(parts.end(), tail.begin(), tail.end());
  EXPECT_EQ(parts, whole);
}

TEST(SpecialTokens, LongestMatchWinsWhenTheyOverlap) {
  SpecialTokenMatcher m({"<|end|>", "<|end|><|pad|>", "<|e"});
  auto hit = m.find("ab<|end|><|pad|>c", 0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->begin, 2u);
  EXPECT_EQ(hit->length, 14u);
  EXPECT_EQ(hit->index, 1u);
  hit = m.find("<|end|>x", 0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->index, 0u);
}

TEST(SpecialTokens, EncodeUsesTheLongestAndNeverMergesAcrossThem) {
  TrainOptions o;
  o.vocab_size = 400;
  o.special_tokens = {"<|end|>", "<|end|><|pad|>"};
  Tokenizer tok = train_bpe_on_text(random_text(20000, 3) + "<|end|><|pad|>abc<|end|>", o);
  const TokenId end = *tok.special_token_id("<|end|>");
  const TokenId both = *tok.special_token_id("<|end|><|pad|>");
  auto ids = tok.encode("x<|end|><|pad|>y<|end|>z");
  std::vector<TokenId> expect = tok.encode("x");
  expect.push_back(both);
  for (TokenId t : tok.encode("y")) expect.push_back(t);
  expect.push_back(end);
  for (TokenId t : tok.encode("z")) expect.push_back(t);
  EXPECT_EQ(ids, expect);
}

// ---- GPT-2 -------------------------------------------------------------------------------------------

TEST(Gpt2, IdsEqualTiktoken) {
  LOOM_REQUIRE_GPT2();
  Tokenizer tok = load_tokenizer(gpt2_dir());
  EXPECT_EQ(tok.vocab_size(), 50257u);
  EXPECT_EQ(tok.special_token_id("<|endoftext|>"), std::optional<TokenId>(50256));
  auto fixture_json = nlohmann::json::parse(read_text(fixture("gpt2_reference.json")));
  ASSERT_GE(fixture_json["cases"].size(), 10u);
  for (const auto& c : fixture_json["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<TokenId> expect = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok.encode(text), expect) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(expect), text);
  }
}

TEST(Gpt2, KnownIdsWithoutFixture) {
  LOOM_REQUIRE_GPT2();
  Tokenizer tok = load_tokenizer(gpt2_dir());
  // Widely published GPT-2 ids: "Hello world" = [15496, 995], "<|endoftext|>" = 50256.
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (std::vector<TokenId>{50256}));
}

TEST(Gpt2, HfJsonOfGpt2EncodesTheSame) {
  LOOM_REQUIRE_GPT2();
  Tokenizer tok = load_tokenizer(gpt2_dir());
  Tokenizer again = tokenizer_from_hf_json(to_hf_json(tok));
  const std::string text = random_text(20000, 11) + "<|endoftext|>\n\n";
  EXPECT_EQ(again.encode(text), tok.encode(text));
  EXPECT_EQ(again.special_tokens(), tok.special_tokens());
}

// ---- round trips, decoding ------------------------------------------------------------------------

TEST(RoundTrip, DecodeEncodeIsIdentity) {
  std::vector<Tokenizer> toks;
  toks.push_back(small_tokenizer());
  if (have_gpt2()) toks.push_back(load_tokenizer(gpt2_dir()));
  const std::vector<std::string> texts = {
      "Plain ASCII text, with punctuation!? And   spaces\tand\nnewlines.\n\n",
      "Accented: caf\u00e9, na\u00efve, \u00c5ngstr\u00f6m, pi\u00f1ata, \u0158e\u017eicha",
      "Emoji: \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EF\U0001F1F5",
      "Mixed: English, \u65e5\u672c\u8a9e, \ud55c\uad6d\uc5b4, \u0420\u0443\u0441\u0441\u043a\u0438\u0439, "
      "\u0627\u0644\u0639\u0631\u0628\u064a\u0629, \u05e2\u05d1\u05e8\u05d9\u05ea, \u0939\u093f\u0928\u094d\u0926\u0940 "
      "<|endoftext|> \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
      random_text(50000, 99)};
  for (const Tokenizer& tok : toks) {
    for (const std::string& t : texts) EXPECT_EQ(tok.decode(tok.encode(t)), t);
  }
}

TEST(RoundTrip, ArbitraryBytesSurviveEncodeDecodeBytes) {
  Tokenizer tok = small_tokenizer();
  std::mt19937 rng(5);
  std::string bytes;
  for (int i = 0; i < 5000; ++i) bytes.push_back(static_cast<char>(rng() & 0xFF));
  EXPECT_EQ(tok.decode_bytes(tok.encode(bytes)), bytes);
}

TEST(Decode, InvalidUtf8BecomesReplacementCharacterLikePython) {
  // Expected strings from Python: bytes.decode("utf-8", errors="replace").
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("\xe2\x82"), r);
  EXPECT_EQ(replace_invalid_utf8("\xff\xfe"), r + r);
  EXPECT_EQ(replace_invalid_utf8("a\xc3"), "a" + r);
  EXPECT_EQ(replace_invalid_utf8("\xed\xa0\x80"), r + r + r);
  EXPECT_EQ(replace_invalid_utf8("\xf0\x9f\x98" "a"), r + "a");
  EXPECT_EQ(replace_invalid_utf8("\xc0\xaf"), r + r);
  EXPECT_EQ(replace_invalid_utf8("\xe0\x80\xaf"), r + r + r);
  EXPECT_EQ(replace_invalid_utf8("ok \xf0\x9f\x98\x80"), "ok \xf0\x9f\x98\x80");

  Tokenizer tok = small_tokenizer();
  // Half of a 3-byte character, as single-byte tokens.
  std::vector<TokenId> half = {*tok.token_id("\xe6"), *tok.token_id("\x97")};
  EXPECT_EQ(tok.decode(half), r);
  EXPECT_EQ(tok.decode_bytes(half), "\xe6\x97");
}

TEST(Decode, OutOfRangeIdIsAnError) {
  Tokenizer tok = small_tokenizer();
  std::vector<TokenId> bad = {1, static_cast<TokenId>(tok.vocab_size())};
  try {
    tok.decode(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

// ---- streaming --------------------------------------------------------------------------------------

TEST(Stream, ChunkedEncodeEqualsWholeEncode) {
  Tokenizer tok = small_tokenizer();
  std::string text = random_text(600000, 21);
  for (size_t at = 5000; at < text.size(); at += 77777) text.insert(at, "<|endoftext|>");
  text += std::string(3000, ' ') + "\xff tail";  // a long whitespace run and invalid UTF-8 at the end
  const std::vector<TokenId> whole = tok.encode(text);
  for (int threads : {1, 2, 3}) {
    for (size_t chunk : {size_t{64}, size_t{1000}, size_t{1} << 20}) {
      EncodeOptions o;
      o.threads = threads;
      o.chunk_bytes = chunk;
      std::istringstream in(text);
      std::vector<TokenId> streamed;
      size_t parts = 0;
      tok.encode_stream(in, [&](std::span<const TokenId> ids) {
        streamed.insert(streamed.end(), ids.begin(), ids.end());
        ++parts;
      }, o);
      EXPECT_EQ(streamed, whole) << "threads " << threads << " chunk " << chunk;
      if (chunk == 1000) {
        EXPECT_GT(parts, 100u);
      }
      EXPECT_EQ(tok.encode(text, o), whole);
    }
  }
}

// ---- a tokenizer.json written by Hugging Face -----------------------------------------------------

TEST(HuggingFace, ReadsTheirFileAndEncodesLikeThem) {
  Tokenizer tok = load_tokenizer(fixture("hf_tokenizer.json"));  // merges in the "a b" form
  EXPECT_EQ(tok.vocab_size(), 400u);
  EXPECT_TRUE(tok.special_token_id("<|endoftext|>").has_value());
  auto ref = nlohmann::json::parse(read_text(fixture("hf_reference.json")));
  ASSERT_GE(ref["cases"].size(), 10u);
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<TokenId>>()) << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
}
